"""MIG geometry: the data file, name resolution, layout enumeration and mig-parted export."""

from __future__ import annotations

import itertools
import json

import pytest
from greenctl.data.bundled import path_of
from greenctl.data.errors import FileFormatError, InputError
from greenctl.data.mig_geometry import (
    Placement,
    enumerate_layouts,
    is_valid_layout,
    layouts_by_multiset,
    layouts_document,
    load_geometry,
    multiset,
    resolve_gpu,
)
from greenctl.data.mig_parted import (
    check_devices_disjoint,
    group_layouts,
    parse_mig_parted,
    to_mig_parted_yaml,
)

A100_40 = {
    # name: (id, compute slices, memory slices, starts, width)
    "1g.5gb": (19, 1, 1, [0, 1, 2, 3, 4, 5, 6], 1),
    "1g.5gb+me": (20, 1, 1, [0, 1, 2, 3, 4, 5, 6], 1),
    "1g.10gb": (15, 1, 2, [0, 2, 4, 6], 2),
    "2g.10gb": (14, 2, 2, [0, 2, 4], 2),
    "3g.20gb": (9, 3, 4, [0, 4], 4),
    "4g.20gb": (5, 4, 4, [0], 4),
    "7g.40gb": (0, 7, 8, [0], 8),
}
SAME_GEOMETRY = {
    "A100-80GB": ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "H100-80GB": ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "H100-NVL-94GB": [
        "1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"
    ],
    "H200-141GB": [
        "1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"
    ],
}  # fmt: skip


def _row(p):
    return (p.id, p.compute_slices, p.memory_slices, list(p.starts), p.width)


def test_a100_40gb_profiles_are_the_issue_s_table():
    geo = resolve_gpu("A100-40GB")
    assert (geo.memory_slices, geo.compute_slices) == (8, 7)
    assert {p.name: _row(p) for p in geo.profiles} == A100_40
    assert geo.profile("1g.5gb+me").max_per_gpu == 1


@pytest.mark.parametrize("name", sorted(SAME_GEOMETRY))
def test_other_8_slice_gpus_share_the_a100_geometry_under_their_names(name):
    geo = resolve_gpu(name)
    assert [p.name for p in geo.profiles] == SAME_GEOMETRY[name]
    assert [_row(p) for p in geo.profiles] == list(A100_40.values())
    assert geo.whole_profile.name == SAME_GEOMETRY[name][-1]


def test_a30_geometry():
    geo = resolve_gpu("A30")
    assert (geo.memory_slices, geo.compute_slices) == (4, 4)
    rows = {p.name: _row(p) for p in geo.profiles}
    assert rows["1g.6gb"] == (14, 1, 1, [0, 1, 2, 3], 1)
    assert rows["2g.12gb"] == (5, 2, 2, [0, 2], 2)
    assert rows["4g.24gb"] == (0, 4, 4, [0], 4)
    assert {"1g.6gb+me", "2g.12gb+me"} <= set(rows)


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-40GB"),
        ("a100-40gb", "A100-40GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("H100-80GB", "H100-80GB"),
        ("NVIDIA H100 NVL", "H100-NVL-94GB"),
        ("NVIDIA H200", "H200-141GB"),
        ("NVIDIA A30", "A30-24GB"),
        ("A30", "A30-24GB"),
    ],
)
def test_nvml_names_and_aliases_resolve(name, canonical):
    assert resolve_gpu(name).name == canonical


def test_unknown_gpu_lists_the_known_ones():
    with pytest.raises(InputError) as err:
        resolve_gpu("NVIDIA GeForce RTX 4090")
    assert "A100-40GB" in str(err.value) and "A30-24GB" in str(err.value)


def test_three_g_plus_three_g_plus_one_g_is_rejected_although_compute_fits():
    geo = resolve_gpu("A100-40GB")
    pair = (Placement(0, "3g.20gb"), Placement(4, "3g.20gb"))
    assert is_valid_layout(geo, pair)
    # 3 + 3 + 1 = 7 compute slices fit, but the two 3g instances hold all 8 memory slices
    assert sum(geo.profile(p.profile).compute_slices for p in pair) + 1 <= geo.compute_slices
    for start in range(7):
        assert not is_valid_layout(geo, (*pair, Placement(start, "1g.5gb")))
    layouts = enumerate_layouts(geo)
    assert all(
        sorted(p.profile for p in lay) != ["1g.5gb", "3g.20gb", "3g.20gb"] for lay in layouts
    )
    assert (Placement(0, "3g.20gb"), Placement(4, "3g.20gb")) in layouts


def test_invalid_start_slot_and_two_me_instances_are_rejected():
    geo = resolve_gpu("A100-40GB")
    assert not is_valid_layout(geo, (Placement(1, "2g.10gb"),))
    assert not is_valid_layout(geo, (Placement(0, "1g.5gb+me"), Placement(1, "1g.5gb+me")))
    assert not is_valid_layout(geo, (Placement(0, "4g.40gb"),))


def _brute_force(geo, names):
    cands = [Placement(s, n) for n in names for s in geo.profile(n).starts]
    valid = set()
    for r in range(1, len(cands) + 1):
        for combo in itertools.combinations(cands, r):
            if is_valid_layout(geo, combo):
                valid.add(tuple(sorted(combo)))
    maximal = {
        lay
        for lay in valid
        if not any(c not in lay and is_valid_layout(geo, (*lay, c)) for c in cands)
    }
    return maximal


@pytest.mark.parametrize(
    ("gpu", "names"),
    [
        ("A30", ["1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"]),
        ("A100-40GB", ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]),
    ],
)
def test_enumeration_equals_brute_force_over_placements(gpu, names):
    geo = resolve_gpu(gpu)
    got = enumerate_layouts(geo, profiles=names)
    assert len(got) == len(set(got))
    assert {tuple(sorted(lay)) for lay in got} == _brute_force(geo, names)
    for lay in got:
        assert list(lay) == sorted(lay, key=lambda p: p.start)


def test_every_layout_of_every_gpu_is_valid_and_maximal():
    for geo in load_geometry():
        cands = geo.placements()
        layouts = enumerate_layouts(geo)
        assert layouts
        for lay in layouts:
            assert is_valid_layout(geo, lay)
            assert not any(c not in lay and is_valid_layout(geo, (*lay, c)) for c in cands)
            assert sum(p.profile.endswith("+me") for p in lay) <= 1


def test_a100_layouts_match_clovers_19_partitions():
    geo = resolve_gpu("NVIDIA A100-SXM4-40GB")
    clover = json.loads((path_of("clover-mig-partitions")).read_text())
    assert len(clover) == 19
    layouts = enumerate_layouts(
        geo, profiles=["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]
    )
    assert len(layouts) == 19  # Clover's 19 partitions are exactly these placements
    ours = {tuple(sorted(geo.profile(p.profile).compute_slices for p in lay)) for lay in layouts}
    theirs = {tuple(sorted(v)) for v in clover.values()}
    assert ours == theirs and len(ours) == 14


def test_layouts_document_shape_and_multisets():
    geo = resolve_gpu("A100-40GB")
    doc = layouts_document(geo, include_me=False)
    assert set(doc) == {"gpu", "layouts", "multisets"}
    assert doc["gpu"] == "A100-40GB"
    assert doc["layouts"][0] == {"instances": [{"profile": "7g.40gb", "start": 0}]}
    for lay in doc["layouts"]:
        for inst in lay["instances"]:
            assert set(inst) == {"profile", "start"}
    layouts = enumerate_layouts(geo, include_me=False)
    groups = layouts_by_multiset(geo, layouts)
    assert doc["multisets"] == [list(m) for m in groups]
    assert len(doc["multisets"]) == len({multiset(geo, lay) for lay in layouts})
    with_me = layouts_document(geo, include_me=True)
    assert len(with_me["layouts"]) > len(doc["layouts"])


def test_mig_parted_groups_gpus_sharing_a_layout_and_parses_back():
    gpus = [
        (0, ["3g.20gb", "4g.20gb"]),
        (1, ["7g.40gb"]),
        (2, ["4g.20gb", "3g.20gb"]),
        (3, ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]),
    ]
    order = ["7g.40gb", "4g.20gb", "3g.20gb", "2g.10gb", "1g.5gb"]
    assert group_layouts(gpus, order=order)[0] == ([0, 2], {"4g.20gb": 1, "3g.20gb": 1})
    text = to_mig_parted_yaml(gpus, label="demo", order=order)
    doc = parse_mig_parted(text)
    assert doc == {
        "version": "v1",
        "mig-configs": {
            "demo": [
                {"devices": [0, 2], "mig-enabled": True,
                 "mig-devices": {"4g.20gb": 1, "3g.20gb": 1}},
                {"devices": [1], "mig-enabled": True, "mig-devices": {"7g.40gb": 1}},
                {"devices": [3], "mig-enabled": True,
                 "mig-devices": {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}},
            ]
        },
    }  # fmt: skip
    check_devices_disjoint(doc)
    try:
        import yaml
    except ImportError:  # PyYAML is not a greenctl dependency
        return
    assert yaml.safe_load(text) == doc


def test_mig_parted_rejects_bad_label_and_bad_text():
    with pytest.raises(InputError, match="label"):
        to_mig_parted_yaml([(0, ["7g.40gb"])], label="bad label")
    with pytest.raises(InputError, match="no GPUs"):
        to_mig_parted_yaml([])
    good = to_mig_parted_yaml([(0, ["7g.40gb"])])
    with pytest.raises(FileFormatError, match="line 1"):
        parse_mig_parted("version: v2\n" + good.split("\n", 1)[1])
    with pytest.raises(FileFormatError, match="unexpected line"):
        parse_mig_parted(good.replace('"7g.40gb": 1', '"7g.40gb": zero'))
    with pytest.raises(FileFormatError):
        check_devices_disjoint({"mig-configs": {"x": [{"devices": [0]}, {"devices": [0, 1]}]}})
