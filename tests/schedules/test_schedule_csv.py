"""Custom schedules from torch's compute-only CSV: round trip, and malformed files rejected with row and action."""

from __future__ import annotations

import pytest

from pipefill.schedules import (
    SCHEDULE_NAMES,
    Action,
    Costs,
    Kind,
    ScheduleError,
    build_schedule,
    dump_csv,
    load_csv,
    simulate,
)

GPIPE_2x2 = "0F0,0F1,0B0,0B1\r\n1F0,1F1,1B0,1B1\r\n"


@pytest.mark.parametrize(
    ("name", "v"),
    [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("zero-bubble-h1", 3), ("zbv", 2)],
)
def test_csv_round_trips(name: str, v: int) -> None:
    schedule = build_schedule(name, ranks=4, microbatches=8, virtual_stages=v)
    text = dump_csv(schedule)
    again = load_csv(text, microbatches=8)
    assert again.ranks == schedule.ranks
    assert again.placement == schedule.placement
    assert dump_csv(again) == text
    custom = build_schedule("custom", ranks=4, microbatches=8, csv_text=text)
    assert custom.ranks == schedule.ranks and custom.name == "custom"


def test_custom_schedule_simulates_like_the_generated_one() -> None:
    custom = build_schedule("custom", ranks=2, microbatches=2, csv_text=GPIPE_2x2)
    generated = build_schedule("gpipe", ranks=2, microbatches=2)
    assert simulate(custom, Costs.uniform()).step_s == simulate(generated, Costs.uniform()).step_s


def test_idle_cells_and_blank_lines_are_skipped() -> None:
    schedule = load_csv(",0F0,,0F1,0B0,0B1\n1F0,1F1,1B0,,1B1\n\n")
    assert [str(a) for a in schedule.ranks[0]] == ["0F0", "0F1", "0B0", "0B1"]
    assert schedule.num_microbatches == 2 and schedule.placement == (0, 1)


def test_action_spelling() -> None:
    assert str(Action(12, Kind.W, 3)) == "12W3"
    assert Action.parse(" 5I10 ") == Action(5, Kind.I, 10)
    assert Action(0, "F", 1) == Action(0, Kind.F, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"unknown kind 'SEND_F'.*compute-only"):
        Action.parse("0SEND_F1")


@pytest.mark.parametrize(
    ("text", "microbatches", "message"),
    [
        ("0F0,0X0\n1F0,1B0\n", None, r"row 1 \(rank 0\), column 2: action '0X0' has unknown kind 'X'"),
        ("0F0,0B0\n1F0,1RECV_F0,1B0\n", None, r"row 2 \(rank 1\), column 2: action '1RECV_F0' has unknown kind"),
        ("0F0,0B0\n1F0,0B1\n", None, r"row 2 \(rank 1\), column 2: action '0B1' puts stage 0 on rank 1"),
        (GPIPE_2x2.replace("1B1", ""), None, r"rank 1 \(row 2\), stage 1, microbatch 1: backward is missing"),
        ("0F0,0B0\n1F0,1B0\n", 2, r"stage 0, microbatch 1: forward '0F1' is missing"),
        ("0F0,0F0,0B0\n1F0,1B0\n", None, r"rank 0 \(row 1\), action #1 '0F0' repeats rank 0 \(row 1\), action #0"),
        ("0F0,0I0,0B0\n1F0,1B0\n", None, r"has both full backward '0B0' and split backward"),
        ("0F0,0I0\n1F0,1B0\n", None, r"'0W0' is missing; a split backward needs both I and W"),
        ("0F0,0B0\n2F0,2B0\n", None, r"stage 1 appears on no row, but stages up to 2 do"),
        ("0F0,0B0\n1F0,1B\n", None, r"row 2 \(rank 1\), column 2: action '1B' is not of the form"),
        ("\n\n", None, r"schedule CSV is empty"),
        ("0F0,0B0\n\n2F0,2B0\n", None, r"row 2 \(rank 1\) has no actions"),
    ],
)
def test_malformed_csv_names_row_and_action(text: str, microbatches: int | None, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        load_csv(text, microbatches=microbatches)


def test_out_of_rank_order_is_a_deadlock_naming_the_action() -> None:
    # rank 0 wants the gradient of microbatch 0 before sending microbatch 1 on, but rank 1 wants microbatch 1 first
    text = "0F0,0B0,0F1,0B1\n1F0,1F1,1B0,1B1\n"
    with pytest.raises(ScheduleError) as info:
        load_csv(text)
    message = str(info.value)
    assert message.startswith("deadlock after 2 of 8 actions: ")
    assert "rank 0 (row 1), action #1 '0B0' can never run: it needs the input gradient of stage 1" in message
    assert "produced by rank 1 (row 2), action #2 '1B0', which waits behind rank 1 (row 2), action #1 '1F1'" in message


def test_backward_listed_before_its_forward_is_reported_on_the_same_rank() -> None:
    text = "0F0,0B1,0F1,0B0\n1F0,1F1,1B0,1B1\n"
    with pytest.raises(ScheduleError, match=r"action #1 '0B1' can never run: .*later on the same rank \(action #2\)"):
        load_csv(text)


def test_weight_grad_before_input_grad_is_rejected() -> None:
    text = "0F0,0W0,0I0\n1F0,1B0\n"
    with pytest.raises(ScheduleError, match=r"'0W0' can never run: it needs the input-gradient backward '0I0'"):
        load_csv(text)


def test_custom_needs_matching_ranks_and_csv() -> None:
    with pytest.raises(ScheduleError, match=r"2 rows but the pipeline has 3 ranks"):
        build_schedule("custom", ranks=3, microbatches=2, csv_text=GPIPE_2x2)
    with pytest.raises(ValueError, match=r"needs csv_text"):
        build_schedule("custom", ranks=2, microbatches=2)
    with pytest.raises(ScheduleError, match=r"holds 1 stages per rank, but virtual_stages=2"):
        build_schedule("custom", ranks=2, microbatches=2, virtual_stages=2, csv_text=GPIPE_2x2)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "pipedream"}, r"schedule 'pipedream' is unknown; choose one of gpipe, 1f1b"),
        ({"name": "gpipe", "virtual_stages": 2}, r"'gpipe' holds one stage per rank, got virtual_stages=2"),
        ({"name": "zbv", "virtual_stages": 3}, r"'zbv' holds exactly 2 stages per rank"),
        ({"name": "interleaved-1f1b", "microbatches": 9}, r"multiple of the rounds .* = 2, got microbatches=9"),
        ({"name": "1f1b", "microbatches": 0}, r"microbatches must be a positive integer, got 0"),
        ({"name": "gpipe", "csv_text": GPIPE_2x2}, r"csv_text is only read by schedule 'custom'"),
    ],
)
def test_impossible_settings_are_rejected(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"ranks": 4, "microbatches": 8} | kwargs
    name = args.pop("name")
    with pytest.raises(ValueError, match=message):
        build_schedule(str(name), **args)  # type: ignore[arg-type]


def test_names_accept_torch_spellings() -> None:
    assert build_schedule("ScheduleInterleavedZeroBubble", ranks=2, microbatches=2).name == "zero-bubble-h1"
    assert build_schedule("ZBVZeroBubble", ranks=2, microbatches=4).placement == (0, 1, 1, 0)
    assert "custom" in SCHEDULE_NAMES
