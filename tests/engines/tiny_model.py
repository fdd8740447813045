"""The tiny Llama that the real-engine tests serve with vLLM, made without any model hub.

    python tiny_model.py OUT_DIR [--expect HASH_FILE]   make the model in OUT_DIR
    python tiny_model.py --verify OUT_DIR --expect HASH_FILE   check an existing one

A Llama (hidden 256, 4 layers, 4 heads, vocabulary 4,096, 16,384 positions) with random weights
from a fixed seed, saved in bfloat16, and a byte-level BPE tokenizer trained on a corpus this
script generates from a fixed seed, with a ChatML chat template. Every machine with the pinned
packages (torch 2.13.0, transformers 5.19.0, tokenizers 0.23.3) gets byte-identical
`tokenizer.json` and `model.safetensors`: their sha256 are committed next to this script
(`tiny_model.sha256`, the `sha256sum` format), and `--expect` fails loudly on any difference.

What the model says is noise; what matters is that vLLM runs it the way it runs a real one
(prefill, decode, paged KV cache, prefix caching, the OpenAI server and its metrics).
"""

import argparse
import hashlib
import os
import random
import sys
import tempfile

# Seeds of the weights and of the tokenizer's corpus.
WEIGHT_SEED = 20261203
CORPUS_SEED = 4096

VOCAB = 4096
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# The files whose hashes are committed: what the tokenizer and the weights are.
HASHED = ["tokenizer.json", "model.safetensors"]

# Words the corpus is drawn from: English function words, the vocabulary of the tests'
# prompts, digits and punctuation, so that the merges cover what the tests send.
WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have from or "
    "one had by word but not what all were we when your can said there use an each which she do "
    "how their if will up other about out many then them these so some her would make like him "
    "into time has look two more write go see number no way could people my than first water been "
    "call who oil its now find long down day did get come made may part system prompt user "
    "assistant question answer request model server cache token tokens prefix memory backend "
    "balance load gateway stream chat completion conversation turn session hello world please "
    "explain summarise translate write code function return value error test kernel socket "
    "connection route weight table hash block engine batch queue running waiting ready health "
    "metric sample agent registry node cluster service address port data text document story "
    "short long small large fast slow first second third last next previous again always never"
).split()
PUNCT = [".", ",", "?", "!", ":", ";", "\n", " -", "'s", "(", ")", "\"", "/"]


def corpus(seed: int, lines: int = 40000) -> list[str]:
    """Deterministic text: Python's `random.Random(seed)` draws the same on every platform."""
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        n = rng.randint(3, 24)
        words = []
        for _ in range(n):
            r = rng.random()
            if r < 0.08:
                words.append(str(rng.randint(0, 99999)))
            elif r < 0.12:
                words.append(rng.choice(WORDS).capitalize())
            else:
                words.append(rng.choice(WORDS))
            if rng.random() < 0.1:
                words[-1] += rng.choice(PUNCT)
        out.append(" ".join(words))
        if i % 50 == 0:
            # A chat-shaped line now and then, so the markers' neighbourhood is seen too.
            out.append(f"<|im_start|>user\n{' '.join(words[:5])}<|im_end|>")
    return out


def make_tokenizer(out_dir: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(CORPUS_SEED), trainer=trainer)
    if tok.get_vocab_size() != VOCAB:
        sys.exit(f"tiny_model: the tokenizer has {tok.get_vocab_size()} tokens, not {VOCAB}")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=16384,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return fast


def make_model(out_dir: str, tokenizer) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(WEIGHT_SEED)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=16384,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        dtype="bfloat16",
    )
    with torch.no_grad():
        model = LlamaForCausalLM(config)
        model = model.to(torch.bfloat16)
    model.save_pretrained(out_dir)


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def hashes(out_dir: str) -> dict[str, str]:
    missing = [n for n in HASHED if not os.path.isfile(os.path.join(out_dir, n))]
    if missing:
        sys.exit(f"tiny_model: {out_dir} lacks {', '.join(missing)}")
    return {n: sha256(os.path.join(out_dir, n)) for n in HASHED}


def check(out_dir: str, expect_file: str) -> None:
    want = {}
    with open(expect_file) as f:
        for line in f:
            if line.strip():
                digest, name = line.split()
                want[name] = digest
    got = hashes(out_dir)
    bad = [f"  {n}: expected {want.get(n)}, got {got[n]}" for n in HASHED if want.get(n) != got[n]]
    if bad:
        sys.exit(
            f"tiny_model: the model in {out_dir} differs from the committed hashes ({expect_file}):\n"
            + "\n".join(bad)
            + "\n(different package versions than the pinned ones? see the script's docstring)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--expect", help="a sha256sum file the made files must match")
    ap.add_argument("--verify", action="store_true", help="only check an existing model against --expect")
    args = ap.parse_args()
    if args.verify:
        if not args.expect:
            sys.exit("tiny_model: --verify needs --expect")
        check(args.out_dir, args.expect)
        print(f"tiny_model: {args.out_dir} matches {args.expect}")
        return
    # Build in a fresh folder beside the target, then rename: a half-made model never sits
    # under the final name.
    parent = os.path.dirname(os.path.abspath(args.out_dir))
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".tiny-model-", dir=parent)
    print("tiny_model: training the tokenizer", flush=True)
    tok = make_tokenizer(work)
    print("tiny_model: making the weights", flush=True)
    make_model(work, tok)
    if args.expect:
        check(work, args.expect)
    # mkdtemp and safetensors make them private; the servers may run as another user.
    os.chmod(work, 0o755)
    for name in os.listdir(work):
        os.chmod(os.path.join(work, name), 0o644)
    for name, digest in hashes(work).items():
        print(f"{digest}  {name}")
    if os.path.exists(args.out_dir):
        sys.exit(f"tiny_model: {args.out_dir} exists; remove it first")
    os.rename(work, args.out_dir)


if __name__ == "__main__":
    main()
