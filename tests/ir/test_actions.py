import pytest

from pipeweave.ir import Action, Op, parse_action


@pytest.mark.parametrize("text", ["0F3", "2B5@1", "1F7@3~2", "0F0a", "0F0b", "1SF4", "1RF4", "2SB3",
                                  "1RB3", "0U@2", "0AR@2", "3F1#1", "4AV@3#2", "12F345@67~8#9"])
def test_text_form_round_trips(text: str) -> None:
    assert str(parse_action(text)) == text


def test_fields() -> None:
    action = parse_action("1F7@3~2#1")
    assert action == Action(Op.FORWARD, 1, 7, 0, 3, 2, 1)
    assert action.is_compute and not action.is_comm


@pytest.mark.parametrize("text", ["F3", "0X3", "0F", "0U3", "0F3c", ""])
def test_bad_text_is_rejected_with_the_grammar(text: str) -> None:
    with pytest.raises(ValueError):
        parse_action(text)


def test_constructor_validates() -> None:
    with pytest.raises(ValueError, match="needs a micro-batch"):
        Action(Op.FORWARD, 0)
    with pytest.raises(ValueError, match="takes no micro-batch"):
        Action(Op.STEP, 0, 3)
    with pytest.raises(ValueError, match="stage must be >= 0"):
        Action(Op.FORWARD, -1, 0)
