"""Invalid input raises ValueError (dpaudit.InputError) naming the field, with the CLI's message."""

import pytest

import dpaudit
from conftest import BAD_EVENTS, ROOT, cli


@pytest.mark.parametrize("path", BAD_EVENTS, ids=lambda p: p.name)
def test_bad_event_file_has_the_cli_message(path):
    rel = str(path.relative_to(ROOT))
    p = cli("account", "--event", rel, ok=False)
    assert p.returncode == 2
    cli_message = p.stderr.strip().removeprefix("error: ")
    with pytest.raises(ValueError) as e:
        dpaudit.DpEvent.from_file(path)
    # The same message; the path is the one each was given.
    assert str(e.value) == cli_message.replace(rel, str(path))
    assert e.value.file == str(path)


def test_bad_q_names_its_field():
    with pytest.raises(ValueError) as e:
        dpaudit.DpEvent.from_file(ROOT / "fixtures/events/bad/bad_q.toml")
    assert e.value.field == "event.q" and "field `event.q`" in str(e.value)


def test_unknown_field_names_the_field_and_line():
    with pytest.raises(ValueError) as e:
        dpaudit.DpEvent.from_file(ROOT / "fixtures/events/bad/unknown_field.toml")
    assert e.value.line == 3 and "`sigma`" in str(e.value)
    with pytest.raises(ValueError, match="unknown field `sigma`"):
        dpaudit.DpEvent.from_dict({"type": "gaussian", "noise_multiplier": 1.0, "sigma": 2.0})


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: dpaudit.DpEvent.gaussian(-1.0), "event.noise_multiplier"),
        (lambda: dpaudit.DpEvent.gaussian(float("nan")), "event.noise_multiplier"),
        (lambda: dpaudit.DpEvent.poisson_sampled(1.5, dpaudit.DpEvent.gaussian(1.0)), "event.q"),
        (lambda: dpaudit.DpEvent.composed([dpaudit.DpEvent.gaussian(1.0), {"type": "poisson_sampled", "q": 0.0, "event": {"type": "gaussian", "noise_multiplier": 1.0}}]), "event.q"),
        (lambda: dpaudit.account(dpaudit.DpEvent.gaussian(1.0), delta=2.0), "delta"),
        (lambda: dpaudit.account(dpaudit.DpEvent.gaussian(1.0), delta=1e-5, accountants=["pld", "nope"]), "accountants"),
        (lambda: dpaudit.account(dpaudit.DpEvent.gaussian(1.0), epsilon=-1.0), "epsilon"),
        (lambda: dpaudit.account(dpaudit.DpEvent.gaussian(1.0)), "delta"),
        (lambda: dpaudit.check(dpaudit.DpEvent.gaussian(1.0), max_epsilon=1.0), "delta"),
        (lambda: dpaudit.check(dpaudit.DpEvent.gaussian(1.0), max_epsilon=float("nan"), delta=1e-5), "max_epsilon"),
        (lambda: dpaudit.calibrate(1.0, 1e-5, noise_multiplier=1.0, sample_rate=2.0, solve_for="steps"), "sample_rate"),
        (lambda: dpaudit.calibrate(1.0, 1e-5, sample_rate=0.01), "solve_for"),
        (lambda: dpaudit.DpEvent.from_dict({"type": "self_composed", "count": 3}), None),
    ],
)
def test_invalid_values_name_the_field(make, field):
    with pytest.raises(ValueError) as e:
        make()
    if field is not None:
        assert e.value.field == field, str(e.value)
        assert f"`{field}`" in str(e.value)
    else:
        assert "event" in str(e.value)


def test_unsupported_dp_accounting_event_names_its_path():
    from dp_accounting import dp_event as dpe

    ev = dpe.ComposedDpEvent(
        events=[
            dpe.GaussianDpEvent(noise_multiplier=1.0),
            dpe.SampledWithReplacementDpEvent(source_dataset_size=10, sample_size=2, event=dpe.GaussianDpEvent(noise_multiplier=1.0)),
        ]
    )
    with pytest.raises(ValueError) as e:
        dpaudit.DpEvent.from_dp_accounting(ev)
    assert e.value.field == "event.events[1]" and "SampledWithReplacementDpEvent" in str(e.value)


def test_bad_sampler_config_names_file_and_field(tmp_path):
    good = (ROOT / "fixtures/samplers/edm-cifar10-paper.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(good.replace("[privacy]", "[privacy]\nbogus_key = 1", 1))
    p = cli("analyze", str(bad), ok=False)
    assert p.returncode == 2
    with pytest.raises(ValueError) as e:
        dpaudit.analyze(bad)
    assert str(e.value) == p.stderr.strip().removeprefix("error: ")
    assert "bogus_key" in str(e.value)


def test_trajectory_density_is_left_to_the_command_with_the_reason():
    # The extension is built without candle (README "Python"): the empirical denoiser's
    # trajectories are refused, naming the field, the reason and the command that reads them.
    with pytest.raises(ValueError) as e:
        dpaudit.analyze(ROOT / "fixtures/samplers/digits-trajectories.toml")
    msg = str(e.value)
    assert "density" in msg and "models" in msg and "dpaudit analyze" in msg, msg


@pytest.mark.parametrize(
    "text",
    [
        '{"a": ' * 100_000 + "1" + "}" * 100_000,
        '{"type": "composed", "events": [' * 50_000 + "]}" * 50_000,
        "[" * 100_000 + "]" * 100_000,
    ],
    ids=["objects", "events", "arrays"],
)
def test_deeply_nested_json_is_an_input_error_not_a_recursion_error(text):
    # Before: json.loads (or the conversion after it) raised RecursionError.
    with pytest.raises(dpaudit.InputError):
        dpaudit.DpEvent.from_json(text)


def test_deeply_nested_dicts_are_an_input_error():
    d = {"type": "gaussian", "noise_multiplier": 1.0}
    for _ in range(50_000):
        d = {"type": "composed", "events": [d]}
    with pytest.raises(dpaudit.InputError):
        dpaudit.DpEvent.from_dict(d)


def test_a_report_made_from_python_records_the_call_not_the_program():
    # Before: the report's command was the whole `python -c` program (sys.argv of the process).
    rep = dpaudit.account(dpaudit.DpEvent.gaussian(1.0), delta=1e-5, accountants="gdp").report
    assert rep["command"] == "python: dpaudit.account"
    rep = dpaudit.check(dpaudit.DpEvent.gaussian(1.0), max_epsilon=10.0, delta=1e-5).accounting.report
    assert rep["command"] == "python: dpaudit.check"
