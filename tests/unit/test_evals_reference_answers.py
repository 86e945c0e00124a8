"""Every shipped task's checker accepts a right answer and rejects wrong ones.

Right answers are written the way a model would reply (fences, a sentence around the answer),
so the extraction is exercised too. Code answers run in the real sandbox.
"""

from __future__ import annotations

import json

import pytest

from sparkfleet.evals.checks import score
from sparkfleet.evals.tasks import Task, load_tasks

TASKS = {t.id: t for t in load_tasks()}


def fence(code: str) -> str:
    return f"Here is the function:\n\n```python\n{code.strip()}\n```\n"


CODE = {
    "code_merge_ranges": """
def merge_ranges(ranges):
    out = []
    for s, e in sorted(ranges):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out
""",
    "code_count_vowels": "def count_vowels(text):\n    return sum(c in 'aeiou' for c in text.lower())",
    "code_fizzbuzz_list": """
def fizzbuzz_list(n):
    out = []
    for i in range(1, n + 1):
        s = ('Fizz' if i % 3 == 0 else '') + ('Buzz' if i % 5 == 0 else '')
        out.append(s or str(i))
    return out
""",
    "code_second_largest": """
def second_largest(nums):
    d = sorted(set(nums))
    return d[-2] if len(d) >= 2 else None
""",
    "code_caesar": """
def caesar(text, shift):
    out = []
    for c in text:
        if 'a' <= c <= 'z':
            out.append(chr((ord(c) - 97 + shift) % 26 + 97))
        elif 'A' <= c <= 'Z':
            out.append(chr((ord(c) - 65 + shift) % 26 + 65))
        else:
            out.append(c)
    return ''.join(out)
""",
    "code_digital_root": "def digital_root(n):\n    return 0 if n == 0 else 1 + (n - 1) % 9",
    "code_rle_encode": """
def rle_encode(s):
    import itertools
    return ''.join(f'{k}{len(list(g))}' for k, g in itertools.groupby(s))
""",
    "code_matmul": """
def matmul(a, b):
    if len(a[0]) != len(b):
        raise ValueError('shape')
    return [[sum(x * y for x, y in zip(row, col)) for col in zip(*b)] for row in a]
""",
    "code_unique_in_order": "def unique_in_order(items):\n    return list(dict.fromkeys(items))",
    "code_snake_to_camel": """
def snake_to_camel(name):
    parts = [p for p in name.split('_') if p]
    return parts[0] + ''.join(p.capitalize() for p in parts[1:]) if parts else ''
""",
    "code_is_anagram": """
def is_anagram(a, b):
    norm = lambda s: sorted(s.replace(' ', '').lower())
    return norm(a) == norm(b)
""",
    "code_prime_factors": """
def prime_factors(n):
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    if n > 1:
        out.append(n)
    return out
""",
    "code_find_index": """
def find_index(sorted_items, target):
    lo, hi = 0, len(sorted_items)
    while lo < hi:
        mid = (lo + hi) // 2
        if sorted_items[mid] < target:
            lo = mid + 1
        else:
            hi = mid
    return lo if lo < len(sorted_items) and sorted_items[lo] == target else -1
""",
    "code_word_freq": """
import re
def word_freq(text):
    out = {}
    for w in re.findall('[A-Za-z]+', text):
        out[w.lower()] = out.get(w.lower(), 0) + 1
    return out
""",
    "code_balanced": """
def balanced(s):
    pairs = {')': '(', ']': '[', '}': '{'}
    stack = []
    for c in s:
        if c in '([{':
            stack.append(c)
        elif c in pairs:
            if not stack or stack.pop() != pairs[c]:
                return False
    return not stack
""",
    "code_pascal_row": """
def pascal_row(n):
    row = [1]
    for _ in range(n):
        row = [1] + [a + b for a, b in zip(row, row[1:])] + [1]
    return row
""",
    "code_flatten_dict": """
def flatten_dict(d, sep='.'):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            for k2, v2 in flatten_dict(v, sep).items():
                out[f'{k}{sep}{k2}'] = v2
        else:
            out[k] = v
    return out
""",
    "code_chunks": """
def chunks(items, size):
    if size < 1:
        raise ValueError('size')
    return [items[i:i + size] for i in range(0, len(items), size)]
""",
    "code_to_roman": """
def to_roman(n):
    vals = [(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'),
            (50, 'L'), (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')]
    out = ''
    for v, s in vals:
        while n >= v:
            out += s
            n -= v
    return out
""",
    "code_gcd_all": "import math\ndef gcd_all(nums):\n    return math.gcd(*nums)",
    "code_moving_average": """
def moving_average(xs, k):
    return [sum(xs[i:i + k]) / k for i in range(len(xs) - k + 1)]
""",
    "code_common_prefix": """
import os
def common_prefix(words):
    return os.path.commonprefix(words) if words else ''
""",
    "code_count_islands": """
def count_islands(grid):
    seen = set()
    def sink(r, c):
        stack = [(r, c)]
        while stack:
            r, c = stack.pop()
            if (r, c) in seen or not (0 <= r < len(grid) and 0 <= c < len(grid[r])) or grid[r][c] != '1':
                continue
            seen.add((r, c))
            stack += [(r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)]
    count = 0
    for r, row in enumerate(grid):
        for c, ch in enumerate(row):
            if ch == '1' and (r, c) not in seen:
                count += 1
                sink(r, c)
    return count
""",
    "code_parse_duration": """
import re
def parse_duration(text):
    m = re.fullmatch(r'(?:(\\d+)h)?(?:(\\d+)m)?(?:(\\d+)s)?', text)
    if not text or not m:
        raise ValueError(text)
    h, mi, s = (int(g) if g else 0 for g in m.groups())
    return h * 3600 + mi * 60 + s
""",
    "code_hamming": """
def hamming(a, b):
    if len(a) != len(b):
        raise ValueError('lengths differ')
    return sum(x != y for x, y in zip(a, b))
""",
}

JSON_RIGHT = {
    "json_person": {"name": "Ada Quill", "age": 34, "email": "ada@example.org"},
    "json_server_config": {"server": {"host": "127.0.0.1", "port": 8080}, "debug": False},
    "json_tool_call": {"name": "get_forecast", "arguments": {"city": "Oslo", "days": 3}},
    "json_sorted_array": [3, 7, 19, 25, 42],
    "json_empty_values": {"count": 0, "flag": True, "nothing": None, "items": [], "label": ""},
    "json_escape_path": {"path": 'C:\\temp\\new "folder"'},
    "json_inventory": [
        {"item": "hammer", "qty": 1},
        {"item": "nails", "qty": 50},
        {"item": "tape", "qty": 2},
    ],
    "json_letter_counts": {"b": 1, "a": 3, "n": 2},
    "json_date_parts": {"year": 2024, "month": 3, "day": 15},
    "json_primary_light": {"colors": ["red", "green", "blue"]},
}
JSON_WRONG = {
    "json_person": [{"name": "Ada", "age": 12, "email": "ada@example.org"}, {"name": "Ada", "age": 30}],
    "json_server_config": [{"server": {"host": "127.0.0.1", "port": "8080"}, "debug": False}],
    "json_tool_call": [{"name": "get_forecast", "arguments": {"city": "Oslo", "days": "3"}}],
    "json_sorted_array": [[42, 25, 19, 7, 3], [3, 7, 19, 25]],
    "json_empty_values": [{"count": 0, "flag": "true", "nothing": None, "items": [], "label": ""}],
    "json_escape_path": [{"path": "C:\\temp\\new folder"}],
    "json_inventory": [[{"item": "hammer", "qty": 0}, {"item": "nails", "qty": 5}, {"item": "tape", "qty": 2}]],
    "json_letter_counts": [{"b": 1, "a": 2, "n": 2}],
    "json_date_parts": [{"year": "2024", "month": 3, "day": 15}],
    "json_primary_light": [{"colors": ["red", "blue", "green"]}],
}

FORMAT = {
    "format_five_bullets": (
        "- apple\n- pear\n- plum\n- fig\n- kiwi",
        ["- apple\n- pear\n- plum\n- fig", "Fruits:\n- apple\n- pear\n- plum\n- fig\n- kiwi"],
    ),
    "format_planet_table": (
        "| Planet | Order |\n|---|---|\n| Mercury | 1 |\n| Venus | 2 |\n| Earth | 3 |",
        [
            "| Planet | Order |\n|---|---|\n| Mercury | 1 |\n| Venus | 2 |",
            "Here:\n| Planet | Order |\n|---|---|\n| Mercury | 1 |\n| Venus | 2 |\n| Earth | 3 |",
        ],
    ),
    "format_two_sentences": (
        "The sea is wide and grey. Its waves never rest.",
        ["The sea is wide.", "The sea is *wide*. It is deep. It is cold."],
    ),
    "format_caps_line": (
        "MARS, THE RED PLANET, IS COLD, DRY AND FAR",
        ["Mars, the red planet, is cold, dry and far", "MARS, RED, COLD", "THE MARS, A, B, C"],
    ),
    "format_one_word": ("tokyo", ["Tokyo", "tokyo.", "The capital is tokyo"]),
    "format_python_list": ("[1, 4, 9, 16]", ["[1,4,9,16]", "```\n[1, 4, 9, 16]\n```", "[0, 1, 4, 9]"]),
    "format_four_colour_lines": (
        "red\ngreen\nblue\nyellow",
        ["red\ngreen\nblue", "red\ngreen\nlight blue\nyellow"],
    ),
    "format_numbered_steps": (
        "1. Boil water.\n2. Add the egg.\n3. Wait nine minutes.",
        ["1. Boil water.\n2. Add the egg.", "1. Boil.\n3. Add.\n4. Wait."],
    ),
    "format_eight_words": (
        "Cold winter winds whistle through the empty streets.",
        ["Winter is cold.", "Cold winter winds whistle. Through the empty streets."],
    ),
}

PROSE_RIGHT = (
    "The keeper climbed the narrow stairs as rain hammered the glass. Below him the sea threw itself "
    "against the rocks, and somewhere beyond the reef a fishing boat was fighting its way home. He "
    "trimmed the wick, wiped the lens with a soft cloth and checked the clockwork that turned the great "
    "light. Every few minutes he stepped onto the gallery, squinting into the dark for a mast or a "
    "lantern. Near midnight he saw it: a small red glow, rising and falling, steadily closer. He stayed "
    "at the window until the boat slipped safely into the harbour."
)
PROSE_WRONG = [
    "Too short to count.",
    "# The Keeper\n\n" + PROSE_RIGHT,
    " ".join(["the light keeps turning and turning"] * 12),
    "⟦⟧⟦⟧ " * 40 + PROSE_RIGHT,
]


def right_answer(task: Task) -> str:
    if task.category == "code":
        return fence(CODE[task.id])
    if task.category == "json":
        return "```json\n" + json.dumps(JSON_RIGHT[task.id], indent=2) + "\n```"
    if task.category in ("math", "reasoning"):
        if "word" in task.check:
            return f"Let me think it through step by step.\nThe answer is {task.check['word']}."
        value = task.check["answer"]
        return f"Working it out carefully gives the result.\n**{value:g}**"
    if task.category == "format":
        return FORMAT[task.id][0]
    return PROSE_RIGHT


def wrong_answers(task: Task) -> list[str]:
    common = ["", "I am not sure how to answer that."]
    if task.category == "code":
        entry = task.check["entry"]
        return [
            *common,
            fence(f"def {entry}(*args, **kwargs):\n    return None"),
            fence("def something_else():\n    return 1"),
        ]
    if task.category == "json":
        return [*common, "{}", "{'single': 'quotes'}", *(json.dumps(w) for w in JSON_WRONG[task.id])]
    if task.category in ("math", "reasoning"):
        if "word" in task.check:
            other = next(o for o in task.check["options"] if o.lower() != task.check["word"].lower())
            return [*common, f"The answer is {other}.", f"Not {task.check['word']} but {other}."]
        value = task.check["answer"]
        return [*common, f"The answer is {value + 1:g}.", f"{value:g} is wrong; it is {value * 2 + 3:g}"]
    if task.category == "format":
        return [*common, *FORMAT[task.id][1]]
    return [*common, *PROSE_WRONG]


def test_there_are_reference_answers_for_every_task() -> None:
    assert len(TASKS) >= 75
    for task in TASKS.values():
        assert right_answer(task)


@pytest.mark.parametrize("task_id", sorted(TASKS))
def test_right_answer_passes(task_id: str) -> None:
    task = TASKS[task_id]
    verdict = score(task.category, task.check, right_answer(task))
    assert verdict.passed, f"{task_id}: {verdict.why}"


@pytest.mark.parametrize("task_id", sorted(TASKS))
def test_wrong_answers_fail(task_id: str) -> None:
    task = TASKS[task_id]
    for answer in wrong_answers(task):
        verdict = score(task.category, task.check, answer)
        assert not verdict.passed, f"{task_id} accepted {answer[:80]!r}"
        assert verdict.why
