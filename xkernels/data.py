"""The training and held-out text, built at run time (nothing downloaded, nothing third-party
committed), from two domains:

- code: the source files of the running Python's standard library (a sorted list without the
  top-level test package and tests/ folders; a file is held out when the hash of its relative
  path says so; held-out files that are near-duplicates of a training file, such as the generated
  codec tables of encodings/, are left out of the evaluation);
- math: multi-step arithmetic word problems with worked answers from a seeded generator
  (held-out problems come from other seeds and never repeat a training problem).

Deterministic for a given Python version.
"""

import functools
import hashlib
import random
import sysconfig
from collections import Counter, defaultdict
from pathlib import Path
from typing import Iterator, List, Tuple

DOMAINS = ("code", "math")
HELD_OUT_PERCENT = 10
# A held-out file is a near-duplicate of a training file when at least this share of its distinct
# lines (of more than 8 characters, stripped) appears in that one training file.
NEAR_DUPLICATE_SHARE = 0.3
EOT = "<|endoftext|>"
MASK = "<|mask|>"


def _held_out(name: str) -> bool:
    return int(hashlib.sha256(name.encode()).hexdigest(), 16) % 100 < HELD_OUT_PERCENT


def code_files(split: str) -> List[Path]:
    """Standard-library modules, sorted: the top-level test package, tests/ folders and
    site-packages are left out (test/ folders inside packages, like ctypes/test, are in)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("test/", "site-packages/", "idlelib/idle_test/", "lib2to3/tests/")) or "/tests/" in rel:
            continue
        if _held_out(rel) == (split == "held_out"):
            files.append(path)
    return files


def code_documents(split: str, max_chars: int = 40_000) -> Iterator[str]:
    for path in code_files(split):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            yield text[:max_chars]


def _line_set(text: str) -> set:
    return {line.strip() for line in text.splitlines() if len(line.strip()) > 8}


def near_duplicate_share(doc: str, index: dict) -> float:
    """The largest share of doc's distinct lines found in a single training file (index: line ->
    training file numbers)."""
    lines = _line_set(doc)
    if not lines:
        return 0.0
    hits = Counter(i for line in lines for i in index.get(line, ()))
    return max(hits.values(), default=0) / len(lines)


@functools.lru_cache(maxsize=1)
def held_out_code_documents() -> Tuple[str, ...]:
    """Held-out code documents that are not near-duplicates of any training file (content
    similarity, not only the path hash: the held-out split has generated tables and small
    variants of training files)."""
    index = defaultdict(list)
    for i, doc in enumerate(code_documents("train")):
        for line in _line_set(doc):
            index[line].append(i)
    return tuple(d for d in code_documents("held_out") if near_duplicate_share(d, index) < NEAR_DUPLICATE_SHARE)


_NAMES = ["Ava", "Ben", "Chloe", "Dev", "Emma", "Finn", "Grace", "Hugo", "Iris", "Jon", "Kai", "Lena", "Maya", "Noah"]
_ITEMS = ["apples", "books", "coins", "stickers", "pencils", "marbles", "cards", "shells", "stamps", "cookies"]


def math_problem(rng: random.Random) -> str:
    """A 2-4 step word problem and its worked answer."""
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    total = rng.randint(5, 60)
    lines = [f"{name} has {total} {item}."]
    work = []
    for _ in range(rng.randint(2, 4)):
        kind = rng.choice(["buy", "give", "times", "bags"])
        if kind == "buy":
            n = rng.randint(2, 40)
            lines.append(f"{name} buys {n} more {item}.")
            work.append(f"{total} + {n} = {total + n}.")
            total += n
        elif kind == "give" and total > 1:
            n = rng.randint(1, total - 1)
            lines.append(f"Then {name} gives away {n} {item}.")
            work.append(f"{total} - {n} = {total - n}.")
            total -= n
        elif kind == "times" and total < 200:
            n = rng.randint(2, 4)
            lines.append(f"Then the number of {item} is multiplied by {n}.")
            work.append(f"{total} * {n} = {total * n}.")
            total *= n
        else:
            bags, per = rng.randint(2, 6), rng.randint(2, 9)
            lines.append(f"{name} gets {bags} bags with {per} {item} in each bag.")
            work.append(f"{bags} * {per} = {bags * per}. {total} + {bags * per} = {total + bags * per}.")
            total += bags * per
    question = f"Question: {' '.join(lines)} How many {item} does {name} have now?\n"
    return question + f"Answer: {' '.join(work)} The answer is {total}.\n"


def math_documents(split: str, count: int) -> Iterator[str]:
    """count distinct problems; held-out ones come from other seeds and skip training problems."""
    seen = set()
    if split == "held_out":
        seen = set(math_documents("train", count=2000))
    rng = random.Random(0 if split == "train" else 10_007)
    produced = 0
    while produced < count:
        text = math_problem(rng)
        if text in seen:
            continue
        seen.add(text)
        produced += 1
        yield text


def corpus(split: str, math_count: int = 20_000) -> List[str]:
    """All documents of a split, code then math."""
    return list(code_documents(split)) + list(math_documents(split, math_count))


def _prompt(domain: str, doc: str) -> str:
    """A code file's opening lines, or a problem's question and the start of its answer."""
    if domain == "code":
        return doc[: doc.index("\n", 300) + 1] if "\n" in doc[300:] else doc[:300]
    return doc[: doc.index("Answer:") + len("Answer:")]


def held_out_prompts(domain: str, count: int, rng_seed: int = 0) -> List[str]:
    """Prompts from held-out documents (evaluation)."""
    if domain == "code":
        docs = [d for d in held_out_code_documents() if len(d) > 600]
        docs = random.Random(rng_seed).sample(docs, min(count, len(docs)))
    else:
        docs = list(math_documents("held_out", count))
    return [_prompt(domain, d) for d in docs]


def training_prompts(domain: str, count: int, rng_seed: int = 0) -> List[str]:
    """Prompts from training documents (calibration, never evaluation)."""
    if domain == "code":
        docs = [d for d in code_documents("train") if len(d) > 600]
        docs = random.Random(rng_seed).sample(docs, min(count, len(docs)))
    else:
        docs = list(math_documents("train", 2000))
        docs = random.Random(rng_seed).sample(docs, count)
    return [_prompt(domain, d) for d in docs]
