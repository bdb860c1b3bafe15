"""aprof turned on in verl's ``main_ppo`` by configuration: values in Hydra's override grammar
(read back by hydra-core's own parser where it is installed), the overrides of a plan, and the
check of a verl config's ``aprof`` block (``aprof validate --verl`` too)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from aprof import ConfigError, ProfilerConfig, load_config
from aprof.cli import main
from aprof.verl import aprof_config, load
from aprof.verl._launch import _plain, hydra_value, launch_overrides

ACTOR = "actor_rollout_ref.actor.profiler"
ROLLOUT = "actor_rollout_ref.rollout.profiler"
HOOK = "++ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=aprof.verl.hook.install"


# ---------------------------------------------------------------------------------------------
# hydra_value
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "written"),
    [
        (None, "null"),
        (True, "true"),
        (False, "false"),
        (-3, "-3"),
        (2.5, "2.5"),
        (1e-05, "1e-05"),
        ("actor", "actor"),
        ("/abs/out-1.d", "/abs/out-1.d"),
        ("1-2", "1-2"),  # two numbers in a row read as text
        # Text Hydra would read as another thing, or not read at all.
        ("", "''"),
        ("a b", "'a b'"),
        ("12", "'12'"),
        ("1_0", "'1_0'"),
        ("1e5", "'1e5'"),
        (".5", "'.5'"),
        ("-inf", "'-inf'"),
        ("NaN", "'NaN'"),
        ("True", "'True'"),
        ("null", "'null'"),
        ("a,b", "'a,b'"),
        ("a:b", "'a:b'"),
        ("x=1", "'x=1'"),
        ("{a}", "'{a}'"),
        ("[1]", "'[1]'"),
        ("int(3)", "'int(3)'"),
        ('say "hi"', "'say \"hi\"'"),
        ("é", "'é'"),
        # In quoted text a backslash escapes a quote, and a backslash before one or at the end.
        ("it's", "'it\\'s'"),
        ("a\\'b", "'a\\\\\\'b'"),
        ("C:\\", "'C:\\\\'"),
        ("a\\b", "'a\\b'"),
        # OmegaConf, which holds the composed config, would resolve `${...}`.
        ("${x}", "'\\${x}'"),
        ("\\${x}", "'\\\\\\${x}'"),
        ([], "[]"),
        ({}, "{}"),
        ([1, "a b", [None]], "[1,'a b',[null]]"),
        ({"a": {"b": [1, 2]}, "c": "d"}, "{a:{b:[1,2]},c:d}"),
        # A key cannot be quoted: Hydra's special characters are escaped.
        ({"a b": 1, "k:e,y": 2, "$x": 3, "1a": 4}, "{a\\ b:1,k\\:e\\,y:2,$x:3,1a:4}"),
    ],
)
def test_values_in_hydras_grammar(value: object, written: str) -> None:
    assert hydra_value(value) == written


@pytest.mark.parametrize("key", ["", "1", "-2.5", "true", "Null", "inf", "a'b", 'a"b', "é", "\n"])
def test_a_key_hydra_cannot_write_is_refused(key: str) -> None:
    with pytest.raises(ValueError, match="Hydra cannot write this dict key"):
        hydra_value({"ok": {key: 1}})


@pytest.mark.parametrize("value", [(1, 2), {1: "a"}, b"x", Path("/x")])
def test_a_value_of_another_type_is_refused(value: object) -> None:
    with pytest.raises(TypeError):
        hydra_value(value)


@pytest.fixture(scope="module")
def hydra_reads() -> Callable[[str], tuple[object, object]]:
    """What Hydra reads of an ``++aprof=<text>`` override: the value its parser gives, and
    the value verl's composed config (OmegaConf's) holds, resolved."""
    parsing = pytest.importorskip(
        "hydra.core.override_parser.overrides_parser", reason="hydra-core (nox -s verl)"
    )
    omegaconf = pytest.importorskip("omegaconf").OmegaConf
    parser = parsing.OverridesParser.create()

    def read(text: str) -> tuple[object, object]:
        value = parser.parse_override(f"++aprof={text}").value()
        composed = omegaconf.create({})
        omegaconf.update(composed, "aprof", value, merge=True, force_add=True)  # as Hydra does
        return value, omegaconf.to_container(composed, resolve=True)["aprof"]

    return read


def typed(value: object) -> object:
    """``value`` with the type of each scalar beside it: 1 and 1.0 and True differ."""
    if isinstance(value, dict):
        return {key: typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [typed(item) for item in value]
    return (type(value).__name__, value)


KEY_CHARACTERS = "abcXYZ019_-/+.$%*@?|\\()[]{}:=, \t"
keys = st.text(st.sampled_from(KEY_CHARACTERS), min_size=1, max_size=6).filter(
    lambda key: not (key.strip("+-").isdigit() or key.lower() in ("true", "false", "null"))
)
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
values = st.recursive(
    scalars, lambda inner: st.lists(inner) | st.dictionaries(keys, inner), max_leaves=12
)


@given(values)
@example("it's a \\'quote\\\\'\\")
@example({"k:e,y": ["${x}", "\\${y}", "$${z}", "???", "1_000", "-.5e3", " x "]})
def test_hydra_reads_back_what_was_written(
    hydra_reads: Callable[[str], tuple[object, object]], value: object
) -> None:
    try:
        text = hydra_value(value)
    except ValueError:  # a key Hydra cannot write, such as "1e5" or ".5"
        return
    parsed, composed = hydra_reads(text)
    assert typed(composed) == typed(value)
    if "${" not in json.dumps(value):  # only OmegaConf reads `\${` as `${`
        assert typed(parsed) == typed(value)


# ---------------------------------------------------------------------------------------------
# launch_overrides
# ---------------------------------------------------------------------------------------------

CONFIGS = {
    "defaults": {},
    "every section": {
        "global_profiler": {"tool": "npu", "steps": {"every": 3}, "save_path": "a b/it's"},
        "rollout": {"replicas": "all", "forward_steps": None, "start": "on_step"},
        "roles": {"actor": {"discrete": True}, "ref": {}, "critic": {"enable": False}},
        "tool_config": {
            "torch": {"schedule": {"active": 2, "stages": ["actor_update"]}},
            "nsys": {"options": {"cuda-memory-usage": "true", "kill": "none"}},
        },
        "timeouts": {"stop_s": 10},
        "triggers": {"slow_step": {}},
        "otel": {"receive": True, "port": 4318},
        "colocated": [{"role": "actor"}, {"role": "ref", "replicas": [0], "exclusive": True}],
        "strict": True,
    },
    "absolute save_path": {"global_profiler": {"save_path": "/data/${run}/out"}},
}


@pytest.mark.parametrize("data", list(CONFIGS.values()), ids=list(CONFIGS))
def test_launch_overrides_give_back_the_config_with_save_path_absolute(
    data: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_config(data)
    hook, block = launch_overrides(config)
    assert hook == HOOK
    assert block.startswith("++aprof={")
    plain = _plain(config)
    save_path = config.global_profiler.save_path
    assert plain["global_profiler"]["save_path"] == str(tmp_path / save_path)
    wanted = config.model_dump()
    wanted["global_profiler"]["save_path"] = tmp_path / save_path
    assert load_config(plain).model_dump() == wanted
    assert block == f"++aprof={hydra_value(plain)}"
    # Only what differs from the defaults.
    assert "timeouts" not in plain or plain["timeouts"] == {"stop_s": 10}


@pytest.mark.parametrize("data", list(CONFIGS.values()), ids=list(CONFIGS))
def test_hydra_reads_the_aprof_block_back_as_the_config(
    data: dict[str, Any],
    hydra_reads: Callable[[str], tuple[object, object]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_config(data)
    _, composed = hydra_reads(launch_overrides(config)[1].removeprefix("++aprof="))
    assert isinstance(composed, dict)
    assert load_config(composed) == load_config(_plain(config))


# ---------------------------------------------------------------------------------------------
# aprof_config: the check at launch
# ---------------------------------------------------------------------------------------------


def verl_run(**changes: object) -> dict[str, Any]:
    """A resolved verl config that runs with aprof: verl's profiler off, its rollout profiler
    on (torch, discrete), and an ``aprof`` block; dotted keys changed (None: removed)."""
    cfg: dict[str, Any] = {
        "global_profiler": {"tool": "torch", "steps": None, "save_path": "outputs/profile"},
        "actor_rollout_ref": {
            "actor": {"profiler": {"enable": True, "tool_config": {"torch": {"discrete": True}}}},
            "rollout": {"profiler": {"enable": True, "tool_config": {"torch": {"discrete": True}}}},
        },
        "aprof": {"global_profiler": {"save_path": "/runs/profile", "steps": [1]}},
    }
    for path, value in changes.items():
        *parents, last = path.split(".")
        node = cfg
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return cfg


def test_a_verl_config_without_an_aprof_block_is_verls_own() -> None:
    cfg = verl_run()
    del cfg["aprof"]
    cfg["global_profiler"]["steps"] = [1, 2]
    assert aprof_config(cfg) is None


def test_the_aprof_block_is_aprofs_config() -> None:
    config = aprof_config(verl_run())
    assert isinstance(config, ProfilerConfig)
    assert config.global_profiler.steps.to_config() == [1]
    assert str(config.global_profiler.save_path) == "/runs/profile"
    assert aprof_config(verl_run(**{"global_profiler.steps": []})) == config
    # Without aprof's rollout, verl's rollout profiler settings do not matter.
    off = verl_run(**{f"{ROLLOUT}.enable": False, "aprof.rollout": {"enable": False}})
    assert aprof_config(off) is not None


@pytest.mark.parametrize(
    ("changes", "key", "fragment"),
    [
        ({"aprof.rollout": {"replicas": "some"}}, "aprof.rollout.replicas", ""),
        ({"aprof.roles": {"a b": {}}}, "aprof.roles.a b", ""),
        ({"aprof.stepz": 1}, "aprof.stepz", ""),
        ({"aprof": "profile.yaml"}, "aprof", "expected a mapping"),
        (
            {"aprof.global_profiler.save_path": "outputs/profile"},
            "aprof.global_profiler.save_path",
            "must be absolute, got 'outputs/profile': verl's TaskRunner runs in another folder",
        ),
        (
            {"global_profiler.steps": [1, 2]},
            "global_profiler.steps",
            "verl's own profiler would capture the steps listed too; set it to null",
        ),
        ({f"{ROLLOUT}.enable": False}, f"{ROLLOUT}.enable", "false: verl profiles the rollout"),
        (
            {f"{ROLLOUT}.enable": None, f"{ACTOR}.enable": False},  # inherited from the actor
            f"{ACTOR}.enable",
            "only when enabled",
        ),
        ({"global_profiler.tool": "nsys"}, "global_profiler.tool", "only with torch or npu"),
        ({"global_profiler.tool": None}, "global_profiler.tool", "not null"),
        (
            {f"{ROLLOUT}.tool_config.torch.discrete": False},
            f"{ROLLOUT}.tool_config.torch.discrete",
            "only in discrete mode",
        ),
    ],
)
def test_a_config_verl_would_not_run_as_asked_is_refused_naming_the_key(
    changes: dict[str, object], key: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as info:
        aprof_config(verl_run(**changes))
    assert info.value.key == key
    assert fragment in info.value.reason and "\n" not in str(info.value)
    if key.startswith(("actor_rollout_ref", "global_profiler.tool")):
        assert "aprof.rollout.enable=true needs (or set that to false)" in info.value.reason


def test_the_check_passes_what_a_plan_asks_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verl config with a plan's settings applied (as ``main_ppo`` composes its overrides)
    holds the plan's config."""
    monkeypatch.chdir(tmp_path)
    verl = verl_run(**{"global_profiler.steps": [1, 3], "aprof": None})
    plan = load(verl)
    assert plan.config.rollout.enable
    assert plan.overrides[2:] == ("global_profiler.steps=null",)
    running = verl_run(**{"aprof": _plain(plan.config)})
    assert aprof_config(running) == load_config(_plain(plan.config))


# ---------------------------------------------------------------------------------------------
# aprof validate --verl of a config with an aprof block
# ---------------------------------------------------------------------------------------------


def test_validate_checks_the_aprof_block(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(verl_run()))
    assert main(["validate", "--verl", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert "# the verl config's aprof block" in out
    assert load_config(out) == aprof_config(verl_run())
    path.write_text(yaml.safe_dump(verl_run(**{"global_profiler.steps": [2]})))
    assert main(["validate", "--verl", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("aprof validate: global_profiler.steps: verl's own profiler")
    assert err.count("\n") == 1


def test_validate_without_an_aprof_block_prints_the_plan_and_its_overrides_shell_quoted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(verl_run(aprof=None)))
    assert main(["validate", "--verl", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"#   {HOOK}\n" in out
    assert "#   '++aprof={" in out
    assert "#   global_profiler.steps=null\n" in out


@pytest.mark.parametrize("command", ["validate", "launch-args"])
def test_help_shows_an_example(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    assert f"aprof {command} --verl job.yaml" in out
