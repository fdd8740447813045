"""The summary rows of README.md from the seeds.md files: python3 ratios.py table-*/seeds.md

Per run, precise mode's TTFT P95 over the control's (the rows "ailb (front door, prefix precise) |
ailb (front door) | P / C ms"); then the median, the Hodges-Lehmann estimate (the median of the
pairwise means of the log ratios, each run with itself included) with its 95 % Wilcoxon interval (normal
approximation), and the geometric mean with its 95 % t interval.
"""
import math
import re
import statistics
import sys

ROW = re.compile(r"\| (\d+) \| ailb \(front door, prefix precise\) \| ailb \(front door\) \| ([\d.]+) / ([\d.]+) ms")
T95 = {23: 2.069, 47: 2.012}

ratios = []
for path in sys.argv[1:]:
    for line in open(path):
        m = ROW.match(line)
        if m:
            ratios.append(float(m.group(2)) / float(m.group(3)))
n = len(ratios)
logs = [math.log(r) for r in ratios]
walsh = sorted((logs[i] + logs[j]) / 2 for i in range(n) for j in range(i, n))
k = int(round(len(walsh) / 2 - 1.96 * math.sqrt(n * (n + 1) * (2 * n + 1) / 24)))
mean, sd = statistics.mean(logs), statistics.stdev(logs)
h = T95.get(n - 1, 1.96) * sd / math.sqrt(n)
print(f"runs {n}: median {statistics.median(ratios):.3f}x")
print(f"Hodges-Lehmann {math.exp(statistics.median(walsh)):.3f}x (95 %: {math.exp(walsh[k]):.3f}-{math.exp(walsh[-1 - k]):.3f})")
print(f"geometric mean {math.exp(mean):.3f}x (95 %: {math.exp(mean - h):.3f}-{math.exp(mean + h):.3f})")
print(f"above / under / at 1.00x: {sum(r > 1 for r in ratios)} / {sum(r < 1 for r in ratios)} / {sum(r == 1 for r in ratios)}")
