"""Answer extraction: reasoning stripped, code, JSON and final numbers found as a reader would."""

from __future__ import annotations

import pytest

from sparkfleet.evals.extract import extract_code, extract_final_number, extract_json, strip_reasoning


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
