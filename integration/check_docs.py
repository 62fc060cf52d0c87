#!/usr/bin/env python3
"""make docs-check: the repository's Markdown stands on its own.

- every relative link in README.md, docs/, helm/ and integration/ Markdown resolves, and its
  `#anchor` names a heading of the target (GitHub's anchor rules);
- no tracked file refers to the specification files the project was built from, which a user
  of the repository does not have (`../shared/`, `behavior.md`, `spec/…`).
"""
import os
import re
import subprocess
import sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.chdir(root)
tracked = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True).stdout.split()


def anchors(path):
    out = set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"^#+ (.*)", line)
            if m:
                h = m.group(1).strip().lower()
                h = "".join(c for c in h if c.isalnum() or c in " -_")
                out.add(h.replace(" ", "-"))
    return out


problems = []
for f in [t for t in tracked if t.endswith(".md")]:
    text = open(f, encoding="utf-8").read()
    for m in re.finditer(r"\]\(([^)#\s]*)(#[^)\s]+)?\)", text):
        target, anchor = m.group(1), m.group(2)
        if re.match(r"^[a-z]+:", target):
            continue
        path = os.path.normpath(os.path.join(os.path.dirname(f), target)) if target else f
        if not os.path.exists(path):
            problems.append(f"{f}: link to {target} does not exist")
        elif anchor and path.endswith(".md") and anchor[1:] not in anchors(path):
            problems.append(f"{f}: {target}{anchor}: no such heading")

outside = re.compile(r"\.\./shared/|\bbehavior\.md\b|\bspec/(api|journal|runtime|testbed)\.md\b|\bstyle\.md\b")
for f in tracked:
    if f == "integration/check_docs.py" or not os.path.isfile(f):
        continue
    try:
        text = open(f, encoding="utf-8").read()
    except UnicodeDecodeError:
        continue
    for n, line in enumerate(text.splitlines(), 1):
        if outside.search(line):
            problems.append(f"{f}:{n}: refers to a file outside the repository: {line.strip()[:100]}")

if problems:
    print("\n".join(problems))
    sys.exit(1)
print(f"  ok: links in {sum(t.endswith('.md') for t in tracked)} Markdown files resolve; nothing refers outside the repository")
