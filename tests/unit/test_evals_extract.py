"""Answer extraction: reasoning stripped, code, JSON and final numbers found as a reader would."""

from __future__ import annotations

import pytest

from sparkfleet.evals.extract import (
    extract_code,
    extract_final_number,
    extract_json,
    fences,
    strip_reasoning,
    without_code,
)


def test_reasoning_is_removed_closed_unclosed_and_template_opened() -> None:
    assert strip_reasoning("<think>2+2 is 5?</think>The answer is 4") == "The answer is 4"
    assert strip_reasoning("I think</think>\n42") == "42"
    assert strip_reasoning("Answer: 7 <think>still going") == "Answer: 7"


def test_code_prefers_the_longest_python_fence() -> None:
    text = "```python\nx = 1\n```\nand\n```python\ndef f():\n    return 2\n```\n```bash\nls -la /\n```"
    assert extract_code(text) == "def f():\n    return 2"
    assert extract_code("def g():\n    return 3") == "def g():\n    return 3"
    assert extract_code("```python\ndef cut():\n    return 1") == "def cut():\n    return 1"


def test_json_from_fence_or_braces_and_a_clear_error() -> None:
    assert extract_json('Sure!\n```json\n{"a": 1}\n```') == {"a": 1}
    assert extract_json('The result is {"b": [1, 2]} as asked.') == {"b": [1, 2]}
    assert extract_json("[3, 1]") == [3, 1]
    with pytest.raises(ValueError, match="invalid JSON"):
        extract_json("{'a': 1}")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("17 x 23 = 391\n391", 391),
        ("so the total is\n**$16.00**", 16),
        ("The final answer is 1,275.", 1275),
        ("We get \\boxed{7.5} degrees, not 15", 7.5),
        ("x = 8", 8),
        ("It was -3 degrees, then it rose by 5, to 2 degrees", 2),
        ("no digits here", None),
    ],
)
def test_final_number(text: str, value: float | None) -> None:
    assert extract_final_number(text) == value


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("The answer is 8.", 8),
        ("**8**", 8),
        ("Answer: 8", 8),
        ("**Answer: 8**", 8),
        ("**Answer:** 8", 8),
        ("2**3 = 8", 8),
        ("3**5 - 2**7 = 243 - 128 = 115", 115),
        ("10**8 bytes is a lot; the answer is 8", 8),
        ("The answer is 8.\n```python\nx = 10**9\n```", 8),
        ("```python\nprint(17 * 23)\n```\nThe result is 391.", 391),
    ],
)
def test_final_number_said_around_code(text: str, value: float) -> None:
    assert extract_final_number(text) == value


@pytest.mark.parametrize(
    "text",
    [
        # The reply from issue 13: the fence-only last line, then ** read as a cue.
        "```python\nx = []\nwhile True:\n    x.append(bytearray(10**8))\n```",
        "x = []\nwhile True:\n    x.append(bytearray(10**8))",
        "x = 10**8",
        "```\n8\n```",
        "~~~\n8\n~~~",
        "```python\nanswer = 8",
        "`8`",
        "The answer is `8`.",
        "```8```",
        "import os\n\nn = 8\n\nwhile True:\n    os.fork()",
    ],
)
def test_no_final_number_from_code(text: str) -> None:
    assert extract_final_number(text) is None


def test_fences_of_tildes_backticks_and_cut_off() -> None:
    assert fences("~~~py\na = 1\n~~~\n````\nb = 2\n````\n```python\nc = 3") == [
        ("py", "a = 1\n"),
        ("", "b = 2\n"),
        ("python", "c = 3"),
    ]
    assert extract_code("~~~python\ndef f():\n    return 1\n~~~") == "def f():\n    return 1"


def test_without_code_keeps_the_prose() -> None:
    assert without_code("Use `x = 8` here.").split() == ["Use", "here."]
    assert without_code("Before\n```python\nx = 8\n```\nAfter").split() == ["Before", "After"]
    # A bare program goes, with the assignment paragraphs around it; plain prose stays whole.
    assert without_code("n = 8\n\nwhile True:\n    pass\n\nDone.").split() == ["Done."]
    assert without_code("4x = 32\nx = 8") == "4x = 32\nx = 8"


def test_json_is_not_read_out_of_a_program() -> None:
    with pytest.raises(ValueError):
        extract_json("```python\ndata = [3, 7, 19]\nwhile True:\n    pass\n```")
    with pytest.raises(ValueError):
        extract_json('cfg = {"a": 1}\nwhile True:\n    pass')
    assert extract_json('Use `{"a": 1}`.') == {"a": 1}
    assert extract_json("```python\n[1, 2]\n```") == [1, 2]
