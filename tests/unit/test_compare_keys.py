"""What is the same thing in two runs: groups by ranks and description (never by uid), size buckets, steps."""

from __future__ import annotations

from comm2perfetto.compare.keys import match_groups, size_bucket, step_pairs
from comm2perfetto.sources.report_json import check_report


def _doc(groups: dict[str, tuple[str, str, list[int]]], ops: dict[str, str] | None = None) -> dict:
    """A report document naming ``groups`` (uid -> (name, desc, ranks)), one all_reduce row each."""
    named = {uid: {"name": name, "desc": desc, "ranks": ranks} for uid, (name, desc, ranks) in groups.items()}
    return {"groups": named,
            "collectives": [{"op": (ops or {}).get(uid, "all_reduce"), "process_group": desc or name,
                             "group_uid": uid} for uid, (name, desc, _) in groups.items()]}


def test_groups_match_by_ranks_and_description_not_uid():
    base = _doc({"0[0,1,2,3]": ("0", "default_pg", [0, 1, 2, 3]), "1[0,1]": ("1", "tp", [0, 1]),
                 "2[2,3]": ("2", "tp", [2, 3])})
    # NEW created its groups in another order: other names, so other uids
    new = _doc({"0[0,1,2,3]": ("0", "default_pg", [0, 1, 2, 3]), "1[2,3]": ("1", "tp", [2, 3]),
                "2[0,1]": ("2", "tp", [0, 1])})
    matched = {(g.base_uid, g.new_uid): (g.label, g.how) for g in match_groups(base, new)}
    assert matched == {("0[0,1,2,3]", "0[0,1,2,3]"): ("default_pg", "ranks and description"),
                       ("1[0,1]", "2[0,1]"): ("tp [0-1]", "ranks and description"),
                       ("2[2,3]", "1[2,3]"): ("tp [2-3]", "ranks and description")}


def test_a_group_whose_ranks_changed_matches_by_its_description():
    base = _doc({"0[0,1]": ("0", "default_pg", [0, 1]), "1[0,1]": ("1", "dp", [0, 1])})
    new = _doc({"0[0,1,2,3]": ("0", "default_pg", [0, 1, 2, 3]), "1[0,2]": ("1", "dp", [0, 2]),
                "2[1,3]": ("2", "pp", [1, 3])})
    by_label = {g.label: g for g in match_groups(base, new)}
    assert (by_label["default_pg"].how, by_label["default_pg"].base_ranks, by_label["default_pg"].new_ranks) == (
        "description", (0, 1), (0, 1, 2, 3))
    assert by_label["dp"].how == "description"
    assert (by_label["pp"].base_uid, by_label["pp"].how) == (None, "new only")


def test_an_ambiguous_description_is_not_guessed():
    """Two tp groups in NEW and one (with other ranks) in BASE: which one it became is not known."""
    base = _doc({"1[0,1]": ("1", "tp", [0, 1])})
    new = _doc({"1[0,2]": ("1", "tp", [0, 2]), "2[1,3]": ("2", "tp", [1, 3])})
    hows = sorted(g.how for g in match_groups(base, new))
    assert hows == ["base only", "new only", "new only"]


def test_reports_saved_without_groups_match_by_label():
    old = check_report({"version": 1, "job": {}, "ranks": {},
                        "collectives": [{"op": "all_reduce", "process_group": "default_pg"}]})
    [group] = match_groups(old, old)
    assert (group.label, group.base_uid, group.new_uid, group.base_ranks) == ("default_pg", "default_pg",
                                                                              "default_pg", None)


def test_undescribed_groups_go_by_their_name():
    base = _doc({"3[0,1]": ("3", "undefined", [0, 1])})
    [group] = match_groups(base, base)
    assert group.label == "3" and group.how == "ranks and description"


def test_size_buckets_are_powers_of_two():
    assert size_bucket(4) == (4, 8) and size_bucket(7) == (4, 8) and size_bucket(8) == (8, 16)
    assert size_bucket(437_544) == (262_144, 524_288)  # DDP's one bucket of examples/ddp_train.py
    assert size_bucket(0) == (0, 1) and size_bucket(None) is None


def test_steps_pair_by_number_or_by_position():
    assert step_pairs((0, 1, 2, 3), (2, 3, 4), by_position=False) == [(2, 2), (3, 3)]
    assert step_pairs((5, 6, 7), (20, 21), by_position=True) == [(5, 20), (6, 21)]
