"""What transformers renders and tokenizes for a few conversations with the tiny model, for
ailb's tokenizer test (`ailb-userspace/src/tokenize/tests.rs`).

    VENV/bin/python chat_fixture.py MODEL_DIR OUT_JSON

Run with the vLLM venv that `cargo xtask setup` installs (~/.cache/ailb/vllm-venv), on the
tiny model it makes (~/.cache/ailb/models/tiny-llama); or with only the pinned `transformers`
and `tokenizers` of `vllm-constraints.txt`, on a folder where `tiny_model.make_tokenizer` wrote
the tokenizer (byte-identical: its sha256 is the committed one). The checked-in
`fixtures/tiny_llama_chat.json` was made the second way. For `/v1/chat/completions` vLLM renders
the chat template with transformers' `apply_chat_template` and encodes the text without adding
special tokens; this script does the same and writes, per conversation, the messages, the
rendered text and the token ids.
"""

import json
import sys

from transformers import AutoTokenizer

CONVERSATIONS = [
    ([{"role": "user", "content": "hello world"}], True),
    ([{"role": "user", "content": "hello world"}], False),
    (
        [
            {"role": "system", "content": "You are a model server cache. Explain the prefix, please!"},
            {"role": "user", "content": "What is the kernel socket route weight table? 12345 tokens."},
            {"role": "assistant", "content": "The gateway stream: a hash of the block.\n\nNext turn."},
            {"role": "user", "content": "Again, in a short story (with numbers: 7, 88, 999)?"},
        ],
        True,
    ),
    ([{"role": "user", "content": [{"type": "text", "text": "first part "}, {"type": "text", "text": "second part"}]}], True),
    ([{"role": "user", "content": "unicode: caf\u00e9 \u4f60\u597d \U0001f600 and  two  spaces\ttab"}], True),
]


def main() -> None:
    model, out = sys.argv[1], sys.argv[2]
    tok = AutoTokenizer.from_pretrained(model)
    cases = []
    for messages, add in CONVERSATIONS:
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add)
        ids = tok.encode(text, add_special_tokens=False)
        cases.append({"messages": messages, "add_generation_prompt": add, "text": text, "token_ids": ids})
    with open(out, "w") as f:
        f.write("[\n" + ",\n".join(json.dumps(c, ensure_ascii=False) for c in cases) + "\n]\n")


if __name__ == "__main__":
    main()
