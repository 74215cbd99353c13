"""Write ``corpus.txt``: deterministic English-like sentences from a small grammar (no downloads); and
``sentences.txt``: its first 2048 sentences, one per line, the text corpus ``make demo-embed`` embeds.

The demo trains a byte-level GPT on it; the grammar's regularities (words, agreement, punctuation) are easy enough
that the loss falls visibly within a minute on one CPU core. Run ``python examples/data/make_corpus.py``.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

SUBJECTS = [
    "the cat",
    "a dog",
    "the old man",
    "my sister",
    "the teacher",
    "a small bird",
    "the farmer",
    "our neighbor",
    "the children",
    "the engineer",
    "a young girl",
    "the captain",
    "the baker",
    "his friend",
    "the queen",
]
VERBS = [
    "sees",
    "finds",
    "likes",
    "carries",
    "paints",
    "follows",
    "watches",
    "builds",
    "opens",
    "remembers",
    "cleans",
    "sells",
    "reads",
    "brings",
    "calls",
]
OBJECTS = [
    "the red ball",
    "a wooden box",
    "the river",
    "an apple",
    "the old house",
    "a letter",
    "the garden",
    "a green hat",
    "the bright lamp",
    "a long road",
    "the small boat",
    "a warm bread",
    "the tall tree",
]
PLACES = [
    "in the morning",
    "near the sea",
    "after dinner",
    "on the hill",
    "at the market",
    "under the bridge",
    "before the rain",
    "in the quiet town",
    "by the window",
    "every day",
]
LINKS = ["and then", "because", "while", "but", "so"]


def sentence(rng: random.Random) -> str:
    clause = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}"
    if rng.random() < 0.6:
        clause += f" {rng.choice(PLACES)}"
    if rng.random() < 0.35:
        clause += f", {rng.choice(LINKS)} {rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}"
    return clause[0].upper() + clause[1:] + rng.choice([".", ".", ".", "!"])


def main(size_bytes: int = 200_000) -> None:
    path = Path(__file__).with_name("corpus.txt")
    rng = random.Random(0)
    lines, total = [], 0
    while total < size_bytes:
        paragraph = " ".join(sentence(rng) for _ in range(rng.randint(3, 6)))
        lines.append(paragraph)
        total += len(paragraph) + 1
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    sentences = [s.strip() for line in lines for s in re.findall(r"[^.!]+[.!]", line)][:2048]
    path.with_name("sentences.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
