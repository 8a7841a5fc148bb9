"""Matrix files -> cells: expansion, exclude/include, rules, ids, and errors that name file:line."""

import textwrap

import pytest

from pytest_simplefsdp.paths import MATRIX_DIR
from pytest_simplefsdp.spec.cells import expand
from pytest_simplefsdp.spec.matrix import MatrixError, load_matrix
from pytest_simplefsdp.targets import make_target

BASE = """\
profile: t
target: titan03
device: cpu
world_sizes: [2, 4]
degrees: [dp_shard, tp]
models:
  llama3: {moe: false, module: m, config: c}
  deepseek_v3: {moe: true, module: m, config: c}
axes:
  model: [llama3, deepseek_v3]
  dp_shard: [1, 2, 4]
  tp: [1, 2]
  ep: [1, 2]
  compile: [eager, aot_fx_trace]
rules:
  - name: world-size
    drop_if: world not in world_sizes
    reason: "{world} ranks is not one of {world_sizes}"
  - name: ep-needs-moe
    drop_if: ep > 1 and not moe
    reason: "{model} is dense"
ids:
  dp_shard: {prefix: dp, omit: 1}
  tp: {prefix: tp, omit: 1}
  ep: {prefix: ep, omit: 1}
"""


def load(tmp_path, text, name="m.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    matrix = load_matrix(path)
    make_target(matrix, tmp_path)
    return matrix, *expand(matrix)


def test_cross_product_minus_rules(tmp_path):
    matrix, cells, dropped = load(tmp_path, BASE)
    assert len(cells) + len(dropped) == 2 * 3 * 2 * 2 * 2
    assert all(c.world in (2, 4) for c in cells)
    assert not any(c.axes["model"] == "llama3" and c.axes["ep"] > 1 for c in cells)
    reasons = {d.rule for d in dropped}
    assert reasons == {"world-size", "ep-needs-moe"}
    one = next(d for d in dropped if d.axes == dict(model="llama3", dp_shard=4, tp=2, ep=1, compile="eager"))
    assert one.rule == "world-size" and one.reason == "8 ranks is not one of [2, 4]"


def test_a_layout_outside_world_sizes_is_never_collected_even_without_a_rule(tmp_path):
    """dp_shard 4 x tp 2 = 8 ranks with world_sizes [2, 4] and no world-size rule: n/a with the reason, not a
    cell that fails at run time."""
    text = BASE.replace(
        """  - name: world-size
    drop_if: world not in world_sizes
    reason: "{world} ranks is not one of {world_sizes}"
""",
        "",
    )
    matrix, cells, dropped = load(tmp_path, text)
    assert all(c.world in (2, 4) for c in cells) and len(cells) == len(load(tmp_path, BASE)[1])
    one = next(d for d in dropped if d.axes == dict(model="llama3", dp_shard=4, tp=2, ep=1, compile="eager"))
    assert (one.rule, one.reason) == ("world_sizes", "8 ranks (dp_shard 4 x tp 2) is not one of world_sizes [2, 4]")


def test_ids_are_readable_stable_and_unique(tmp_path):
    _, cells, _ = load(tmp_path, BASE)
    ids = [c.id for c in cells]
    assert len(set(ids)) == len(ids)
    assert "deepseek_v3-dp2-ep2-aot_fx_trace" in ids
    assert "llama3-dp2-tp2-eager" in ids
    _, again, _ = load(tmp_path, BASE, name="again.yaml")
    assert [c.id for c in again] == ids


def test_exclude_and_include(tmp_path):
    text = (
        BASE
        + """\
exclude:
  - {compile: aot_fx_trace, tp: 2}
include:
  - {model: llama3, dp_shard: 4, compile: aot_fx_trace}
"""
    )
    _, cells, _ = load(tmp_path, text)
    assert not any(c.axes["compile"] == "aot_fx_trace" and c.axes["tp"] == 2 for c in cells)
    assert "llama3-dp4-aot_fx_trace" in [c.id for c in cells]


def test_include_that_a_rule_drops_is_an_error(tmp_path):
    text = BASE + "include:\n  - {model: llama3, dp_shard: 4, tp: 2}\n"
    with pytest.raises(
        MatrixError,
        match=r"m\.yaml:\d+: include entry llama3-dp4-tp2-eager cannot run: "
        r"rule 'world-size': 8 ranks",
    ):
        load(tmp_path, text)


def test_smoke_marks_cells(tmp_path):
    _, cells, _ = load(tmp_path, BASE + "smoke:\n  - {model: llama3, dp_shard: 2, tp: 1, compile: eager}\n")
    assert [c.id for c in cells if c.smoke] == ["llama3-dp2-eager"]


@pytest.mark.parametrize(
    "patch, message",
    [
        (("axes:\n", "axes:\n  bogus: [1]\n"), r"m\.yaml:\d+: target 'titan03' has no axis 'bogus'"),
        (("compile: [eager, aot_fx_trace]", "compile: [eager, turbo]"), r"axis 'compile': unknown value 'turbo'"),
        (("dp_shard: [1, 2, 4]", "dp_shard: [1, 0]"), r"m\.yaml:11: degree axis 'dp_shard' has non-positive"),
        (
            ("drop_if: ep > 1 and not moe", "drop_if: ep > 1 and not mystery"),
            r"m\.yaml:20: rule 'ep-needs-moe' uses an unknown name",
        ),
        (
            ("drop_if: ep > 1 and not moe", "drop_if: ep >"),
            r"m\.yaml:20: rule 'ep-needs-moe': drop_if is not a valid expression",
        ),
        (("profile: t\n", "profile: t\nprofiel: x\n"), r"m\.yaml:2: unknown top-level key 'profiel'"),
        (("target: titan03", "target: titan99"), r"unknown target 'titan99'"),
        (("world_sizes: [2, 4]", "world_sizes: [two]"), r"world_sizes` must be a list of positive integers"),
        (("  ep: {prefix: ep, omit: 1}\n", "  ep: {prefx: ep}\n"), r"m\.yaml:\d+: unknown ids.ep key 'prefx'"),
        (
            ("deepseek_v3: {moe: true, module: m, config: c}", "deepseek_v3: {moe: true, module: m}"),
            r"models.deepseek_v3 needs config",
        ),
    ],
)
def test_bad_input_names_file_line_and_value(tmp_path, patch, message):
    old, new = patch
    assert old in BASE
    with pytest.raises(MatrixError, match=message):
        load(tmp_path, BASE.replace(old, new, 1))


def test_exclude_with_unknown_axis(tmp_path):
    with pytest.raises(MatrixError, match=r"m\.yaml:27: `exclude` names unknown axis 'compiler'"):
        load(tmp_path, BASE + "exclude:\n  - {compiler: jit}\n")


def test_exclude_with_a_value_no_axis_has(tmp_path):
    with pytest.raises(
        MatrixError,
        match=r"m\.yaml:27: `exclude` entry tp: 3 is not a value of axis 'tp'; "
        r"its values: 1, 2",
    ):
        load(tmp_path, BASE + "exclude:\n  - {tp: 3}\n")


def test_invalid_yaml_names_line(tmp_path):
    # the unclosed list is on line 3; the parser only notices on line 4
    with pytest.raises(
        MatrixError,
        match=r"m\.yaml:3: not valid YAML: while parsing a flow sequence: .*"
        r"\(noticed at line 4\)",
    ):
        load(tmp_path, "profile: t\naxes:\n  model: [a, b\n  x: 1\n: :\n")


def test_missing_file(tmp_path):
    with pytest.raises(MatrixError, match="cannot read"):
        load_matrix(tmp_path / "nope.yaml")


def test_shipped_profiles():
    """Both profiles load; the cpu profile has at least 30 cells and a smoke tier."""
    counts = {}
    for path in sorted(MATRIX_DIR.glob("*.yaml")):
        if path.stem.endswith("upstream"):
            continue  # they read their generation's installed tests (tests/test_upstream.py)
        matrix = load_matrix(path)
        make_target(matrix, MATRIX_DIR)
        cells, dropped = expand(matrix)
        counts[matrix.profile] = (len(cells), sum(c.smoke for c in cells), matrix)
        assert all(c.world in matrix.world_sizes for c in cells)
    assert counts["cpu"][0] >= 30 and 1 <= counts["cpu"][1] <= 4
    assert counts["h100x8"][0] >= 30
    assert counts["cpu"][2].device == "cpu" and counts["h100x8"][2].device == "cuda"


@pytest.mark.parametrize(
    "expr, message",
    [
        # the escape that once ran os.system from a matrix file, even under --simplefsdp-dry-run
        (
            "().__class__.__base__.__subclasses__()",
            r"call '\(\).__class__.__base__.__subclasses__\(\)': only len, min, max "
            r"may be called",
        ),
        (
            "len(().__class__.__base__.__subclasses__)",
            r"Attribute \(\(\).__class__.__base__.__subclasses__\) is not allowed",
        ),
        ("__import__('os').system('touch {marker}') or True", r"only len, min, max may be called"),
        ("len(__builtins__) > 0", r"name '__builtins__' is not allowed"),
        ("len([c for c in ()]) == 0", r"ListComp .* is not allowed"),
        ("len((lambda: 1,)) == 1", r"Lambda .* is not allowed"),
        ("open('{marker}', 'w')", r"call \"open\('.*', 'w'\)\": only len, min, max may be called"),
        ("world_sizes[0] == 2", r"Subscript .* is not allowed"),
    ],
)
def test_rules_cannot_run_code(tmp_path, expr, message):
    marker = tmp_path / "pwned"
    text = BASE.replace("drop_if: ep > 1 and not moe", f'drop_if: "{expr.format(marker=marker)}"', 1)
    with pytest.raises(MatrixError, match=r"m\.yaml:20: rule 'ep-needs-moe': drop_if .*" + message):
        load(tmp_path, text)
    assert not marker.exists()


def test_rules_keep_their_vocabulary(tmp_path):
    text = BASE.replace(
        "drop_if: ep > 1 and not moe",
        'drop_if: "ep > 1 and not moe or (world not in (2, 4) and max(tp, ep) >= len([1]) + 9)"',
        1,
    )
    _, cells, dropped = load(tmp_path, text)
    assert cells and dropped


@pytest.mark.parametrize("key", ["settings", "models", "ids", "groups"])
def test_a_list_where_a_mapping_belongs_names_the_key_and_line(tmp_path, key):
    text = f"profile: t\ntarget: titan03\nworld_sizes: [1]\ndegrees: []\naxes:\n  model: [llama3]\n{key}: [1, 2]\n"
    (tmp_path / "m.yaml").write_text(text)
    with pytest.raises(MatrixError, match=rf"m\.yaml:7: `{key}` must be a mapping \(name: value\), got a list"):
        load_matrix(tmp_path / "m.yaml")


def test_an_infinite_timeout_is_refused(tmp_path):
    with pytest.raises(MatrixError, match=r"timeout must be a positive number of seconds, got inf"):
        load(tmp_path, BASE + "timeout: .inf\n")


def test_an_included_cell_runs_on_every_version_set_of_the_run(tmp_path):
    """The version sets are the run's, not a cell's choice: an `include` that names no version runs on each of them
    (a twin run once left the seed's 8-rank cells, which are includes, on the installed versions alone)."""
    from pytest_simplefsdp.spec.matrix import with_versions

    text = (
        BASE.replace("  compile: [eager, aot_fx_trace]\n", "  compile: [eager]\n")
        + "exclude:\n  - {dp_shard: 4}\ninclude:\n  - {model: llama3, dp_shard: 4, compile: eager}\n"
    )
    matrix = with_versions(load(tmp_path, text)[0], ["installed", "torch==2.15.0"])
    ids = [c.id for c in expand(matrix)[0] if c.axes["dp_shard"] == 4]
    assert ids == ["llama3-dp4-eager", "llama3-dp4-eager-torch-2.15.0"]


@pytest.mark.parametrize(
    "version, trainers, profile",
    [
        ("0.3.0", {"graph_trainer"}, "cpu"),
        ("0.2.2", {"graph_trainer"}, "cpu"),  # torchtitan main: its version string predates 0.3.0, its trainer does not
        ("0.2.0", {"simple_fsdp"}, "titan02-cpu"),
        ("", set(), "cpu"),  # none installed: the current generation's (a dry run lists it unchecked)
    ],
)
def test_the_auto_profile_follows_what_the_installed_torchtitan_ships(
    monkeypatch, tmp_path, version, trainers, profile
):
    from pytest_simplefsdp.options import Settings
    from pytest_simplefsdp.spec import profiles

    monkeypatch.setattr(profiles, "installed", {"torchtitan": version}.get)
    monkeypatch.setattr(profiles, "torchtitan_trainers", lambda: trainers)
    monkeypatch.setattr(profiles, "cuda_device_ids", lambda: [])
    settings = Settings.__new__(Settings)
    object.__setattr__(settings, "matrix_file", [])
    object.__setattr__(settings, "profile", "auto")
    assert [p.stem for p in profiles.matrix_files(settings, tmp_path)] == [profile]


def test_the_installed_torchtitans_trainers_are_read_from_its_folders(monkeypatch, tmp_path):
    import sys

    from pytest_simplefsdp import machine

    (tmp_path / "torchtitan" / "experiments" / "simple_fsdp").mkdir(parents=True)
    (tmp_path / "torchtitan" / "__init__.py").write_text("raise ImportError('never imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torchtitan", raising=False)
    assert machine.torchtitan_trainers() == {"simple_fsdp"}
