"""Bad config is refused before any job starts, and the message names the key (and the allowed range where
there is one). Checked in-process with the same two checks the workflow runs first (the JSON schema, the top
level's and each unit's section, then lab.settings); tests/test_workflow.py checks that Snakemake itself stops
on them."""
import copy
import re
from pathlib import Path

import pytest
import yaml

from lab import claims, settings, units

ROOT = Path(__file__).resolve().parents[1]
BASE = yaml.safe_load((ROOT / "config.yaml").read_text())


def merged(override: dict) -> dict:
    def merge(a, b):
        for k, v in b.items():
            a[k] = merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
        return a
    return merge(copy.deepcopy(BASE), override)


def check(config: dict) -> None:
    settings.validate(config, units.schemas())
    settings.check(config, units.registry())


def test_the_shipped_config_passes():
    check(merged({}))


# (override, what the message must name: the key, and the limit where there is one)
BAD = [
    ({"sed": 1}, ["sed"]),                                                       # unknown key, top level
    ({"softmax": {"corectness": {"shapes": [[4, 5]], "dtypes": ["float32"]}}}, ["corectness"]),  # misspelled experiment
    ({"softmax": {"bug": {"extra": 1}}}, ["extra", "bug"]),                      # unknown key, experiment level
    ({"bench": {"warmup_ms": 2.5}}, ["warmup_ms", "integer"]),                  # wrong type
    ({"seed": "zero"}, ["seed", "integer"]),                                     # wrong type
    ({"overwrite_foreign_run": "yes"}, ["overwrite_foreign_run", "boolean"]),   # wrong type
    ({"softmax": {"correctness": {"dtypes": []}}}, ["dtypes"]),                  # empty list
    ({"vector_add": {"correctness": {"shapes": []}}}, ["shapes"]),               # empty list
    ({"vector_add": {"correctness": {"sizes": [10**12]}}}, ["sizes", "2147483647"]),  # absurd size
    ({"relu_dropout": {"statistics": {"seeds": 10**9}}}, ["seeds", "10000"]),    # absurd count
    ({"relu_dropout": {"performance": {"p": 1.5}}}, ["relu_dropout.performance.p", "maximum of 1"]),   # probability out of range
    ({"relu_dropout": {"correctness": {"ps": [0.5, 1.0]}}}, ["ps", "maximum of 1"]),  # p = 1 drops everything
    ({"seed": -1}, ["seed", "minimum of 0"]),                                    # out of range
    ({"softmax": {"bug": {"block_size": 1000}}}, ["block_size", "1024"]),         # not a power of two
    ({"attention": {"wall": {"head_dims": [512]}}}, ["head_dims", "256"]),        # unsupported head dim
    ({"flash_attention": {"performance": {"dtype": "float64"}}}, ["dtype", "bfloat16"]),  # unknown dtype
    ({"vector_add": {"performance": {"log2_sizes": [20, 12]}}}, ["vector_add.performance.log2_sizes", "empty"]),
    ({"run": "a/b"}, ["run", "pattern"]),                                        # would escape results/<run>
    ({"run": ".."}, ["run", "pattern"]),
    ({"run": "../elsewhere"}, ["run", "pattern"]),
    ({"run": "compare"}, ["run", "should not be valid"]),                         # the comparisons' folder
    ({"backend": "tpu"}, ["backend", "interpreter"]),
    ({"relu_dropout": {"correctness": {"ps": [float("nan")]}}}, ["relu_dropout.correctness.ps.0", "nan"]),  # no bound refuses NaN
    ({"relu_dropout": {"performance": {"p": float("inf")}}}, ["relu_dropout.performance.p", "inf"]),
    ({"relu_dropout": {"performance": {"pp": 0.3}}}, ["relu_dropout.performance", "'pp' was unexpected"]),  # typo
    ({"vector_add": {"performance": {"p": 0.3}}}, ["vector_add.performance", "'p' was unexpected"]),  # not its
    # a case twice: its rows would be duplicated (claim 9's shape table then failed the report, after every job)
    ({"attention": {"correctness": {"shapes": [[5, 15, 32], [5, 15, 32]]}}}, ["attention.correctness.shapes",
                                                                              "non-unique"]),
    ({"softmax": {"bug": {"n_cols": [2000, 2000]}}}, ["softmax.bug.n_cols", "non-unique"]),
    ({"relu_dropout": {"correctness": {"ps": [0.5, 0.5]}}}, ["relu_dropout.correctness.ps", "non-unique"]),
    # below the limits the limits experiments test: claim 20 would be settled by a size that tests nothing
    ({"softmax": {"limits": {"shapes": [[2, 3]]}}}, ["softmax.limits.shapes", "[2, 3]", "2**31"]),
    ({"flash_attention": {"limits": {"batch": 1, "heads": 1, "seq": 16, "head_dim": 16}}},
     ["flash_attention.limits", "65535", "2**31"]),
    ({"flash_attention": {"limits": {"batch": 70000, "heads": 1, "seq": 16, "head_dim": 16}}},
     ["flash_attention.limits", "2**31"]),
]


@pytest.mark.parametrize("override, named", BAD, ids=[str(o) for o, _ in BAD])
def test_bad_value_is_refused_naming_the_key(override, named):
    with pytest.raises(settings.ConfigError) as err:
        check(merged(override))
    message = str(err.value)
    for word in named:
        assert word in message, (word, message)


def test_a_shape_may_repeat_a_size():
    check(merged({"vector_add": {"correctness": {"shapes": [[64, 64], [3, 3, 3]]}}}))


def test_a_unit_named_as_a_top_level_key_is_refused_naming_the_unit():
    with pytest.raises(settings.ConfigError, match="unit bench .*rename the unit"):
        settings.schema({**units.schemas(), "bench": {"correctness": {"n": {"type": "integer"}}}})


def test_a_section_may_be_left_out_but_not_the_keys_every_run_has():
    config = merged({})
    del config["softmax"]
    check(config)  # that kernel is not run
    del config["bench"]
    with pytest.raises(settings.ConfigError, match="'bench' is a required property"):
        check(config)


def test_at_least_twelve_bad_values_are_covered():
    assert len(BAD) >= 12


# --- what arrives from the command line, and from files ------------------------------------------------------------

def test_command_line_strings_take_the_type_their_key_asks_for():
    config = merged({"overwrite_foreign_run": "true", "seed": "7", "softmax": {"bug": {"n_rows": "3"}},
                     "bench": {"warmup_ms": "25"}})
    given = {"overwrite_foreign_run": "true", "seed": "7", "softmax": {"bug": {"n_rows": "3"}}, "bench": {"warmup_ms": "25"}}
    settings.from_command_line(config, given, units.schemas())
    assert (config["overwrite_foreign_run"], config["seed"], config["softmax"]["bug"]["n_rows"]) == (True, 7, 3)
    assert config["bench"]["warmup_ms"] == 25 and config["bench"]["rep_ms"] == BASE["bench"]["rep_ms"]
    check(config)
    config = merged({"overwrite_foreign_run": "False"})
    settings.from_command_line(config, {"overwrite_foreign_run": "False"}, units.schemas())
    assert config["overwrite_foreign_run"] is False


@pytest.mark.parametrize("typed, parsed", [("2024", 2024), ("007", 7), ("1e3", 1000.0), ("1_0", 10)])
def test_a_numeric_run_name_from_the_command_line_is_the_name_typed(typed, parsed):
    config = merged({"run": parsed})  # what Snakemake makes of --config run=<typed>
    settings.from_command_line(config, {"run": parsed}, units.schemas(), argv=["snakemake", "--config", f"run={typed}"])
    assert config["run"] == typed
    check(config)
    config = merged({"run": parsed})  # from elsewhere (a profile): the number's text
    settings.from_command_line(config, {"run": parsed}, units.schemas(), argv=[])
    assert config["run"] == str(parsed)


def test_command_line_lists_of_lists_take_their_types_too():
    """--config 'vector_add={correctness: {shapes: [[3, 5]]}}': Snakemake leaves the inner numbers strings."""
    given = {"vector_add": {"correctness": {"shapes": [["3", "5"], ["7"]]}}, "softmax": {"correctness": {
        "shapes": [["4", "1000"]]}}}
    config = merged(copy.deepcopy(given))
    settings.from_command_line(config, given, units.schemas())
    assert config["vector_add"]["correctness"]["shapes"] == [[3, 5], [7]]
    assert config["softmax"]["correctness"]["shapes"] == [[4, 1000]]
    check(config)


def test_a_string_that_is_not_of_its_keys_type_stays_a_string_and_is_refused():
    config = merged({"seed": "one"})
    settings.from_command_line(config, {"seed": "one"}, units.schemas())
    with pytest.raises(settings.ConfigError, match="config key seed: 'one' is not of type 'integer'"):
        check(config)


@pytest.mark.parametrize("override, key", [({"seed": 1.0}, "seed"), ({"bench": {"rep_ms": 2.0}}, "bench.rep_ms"),
                                           ({"vector_add": {"correctness": {"sizes": [1.0, 1025]}}},
                                            "vector_add.correctness.sizes.0"),
                                           ({"seed": True}, "seed")])
def test_types_are_strict_an_integer_is_no_float_and_no_boolean(override, key):
    with pytest.raises(settings.ConfigError, match=rf"config key {re.escape(key)}: .* is not of type 'integer'"):
        check(merged(override))


@pytest.mark.parametrize("name", ["a_vs_b", "x" * 101])
def test_a_run_name_that_a_comparison_could_not_address_or_too_long_is_refused(name):
    with pytest.raises(settings.ConfigError, match="config key run: "):
        check(merged({"run": name}))
    check(merged({"run": "x" * 100}))


def test_a_key_given_twice_in_a_config_file_is_refused_naming_the_file_key_and_lines(tmp_path):
    f = tmp_path / "twice.yaml"
    f.write_text("seed: 1\nsoftmax:\n  bug: {n_rows: 2}\n  bug: {n_rows: 3}\n")
    with pytest.raises(settings.ConfigError, match=rf"{re.escape(str(f))}: key 'bug' given twice \(lines 3 and 4\)"):
        settings.check_files([ROOT / "config.yaml", f])
    settings.check_files([ROOT / "config.yaml", ROOT / "tests/tiny_config.yaml"])


@pytest.mark.parametrize("text, kind", [("- a\n- b\n", "list"), ("", "NoneType"), ("just words\n", "str")])
def test_a_config_file_that_is_no_mapping_is_named(tmp_path, text, kind):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(settings.ConfigError, match=rf"{re.escape(str(f))}: .* mapping .* got {kind}"):
        settings.check_files([f])


def test_a_units_schema_names_exactly_its_experiments(monkeypatch):
    from lab.units import vector_add

    monkeypatch.setitem(vector_add.SCHEMA, "not_an_experiment", {"n": {"type": "integer"}})
    with pytest.raises(TypeError, match=r"lab\.units\.vector_add: SCHEMA has settings for .*'not_an_experiment'"):
        units.schemas()


@pytest.mark.parametrize("kind", ["figure", "claim", "section"])
def test_a_table_misspelled_in_a_figure_claim_or_section_is_refused_naming_both(monkeypatch, kind):
    """A typo there would pass for a table the config leaves out (the figure or verdict silently gone)."""
    units.load()
    if kind == "figure":
        fig = next(iter(units.FIGURES.values()))
        monkeypatch.setitem(units.FIGURES, fig.name, units.Figure(fig.name, ("softmax/bgu",), fig.category,
                                                                  fig.caption, fig.draw))
        declared = units.figures
    elif kind == "claim":
        check = units.CHECKS[min(units.CHECKS)]
        monkeypatch.setitem(units.CHECKS, check.id, units.Check(check.id, ("softmax/bgu",), check.fn))
        declared = units.checks
    else:
        sec = next(iter(units.SECTIONS))
        monkeypatch.setitem(units.SECTIONS, sec, units.Section(units.SECTIONS[sec].kernel, ("softmax/bgu",),
                                                               units.SECTIONS[sec].build))
        declared = units.sections
    with pytest.raises(ValueError, match=f"{kind}.*'softmax/bgu', which no experiment makes"):
        declared()
    with pytest.raises(ValueError, match="'softmax/bgu'"):  # as the workflow checks them when it plans
        claims.check_declarations(yaml.safe_load((ROOT / "workflow/claims.yaml").read_text()), units.figures())
