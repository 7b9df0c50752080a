"""Client-side validation: specs, schema comparison and reports, each failure a typed error."""

import numpy as np
import pytest

from redisync import errors
from redisync.store.codec import decode
from redisync.store.schema import Limits, Schema, broadcast, encode_reports, merge

from ..conftest import examples

SCHEMA = Schema.of(
    {
        "motion/bin_failed": merge(8, lifecycle="history"),
        "obs/norm": merge((2, 3), sumsq=True, lifecycle="history"),
        "curriculum/scale": broadcast((), owner=0),
        "terrain/levels": merge(3, elementwise_count=True, lifecycle="history"),
    }
)


def test_specs_reject_bad_shapes_and_options():
    """A spec with a bad shape or option is an invalid schema naming the option."""
    with pytest.raises(errors.InvalidSchema, match="positive"):
        merge((0, 3), lifecycle="history")
    with pytest.raises(errors.InvalidSchema, match="stale_after_s"):
        merge(3, stale_after_s=-1, lifecycle="history")
    with pytest.raises(errors.InvalidSchema, match="owner"):
        broadcast(3, owner=-2)
    with pytest.raises(errors.InvalidSchema, match="term/name"):
        Schema.of({"no_slash": merge(1, lifecycle="history")})
    with pytest.raises(ValueError, match="at least one key"):  # validation errors are ValueErrors too
        Schema.of({})


def test_schema_difference_names_key_and_field():
    """Two schemas' difference names the first key that differs and how."""
    other = Schema.of({**SCHEMA.keys, "motion/bin_failed": merge(9, lifecycle="history")})
    key, diff = SCHEMA.difference(other)
    assert key == "motion/bin_failed"
    assert "shape=(8,) here, (9,) registered" in diff
    extra = Schema.of({**SCHEMA.keys, "terrain/extra": merge(4, lifecycle="history")})
    assert SCHEMA.difference(extra) == ("terrain/extra", "registered but missing from this client's schema")
    assert SCHEMA.difference(SCHEMA) is None
    assert SCHEMA.digest != other.digest


def test_valid_report_is_coerced_to_float64_of_the_key_shape():
    """A valid report of any numeric type is encoded as float64 of the key's shape, broadcast where the spec
    allows."""
    out = encode_reports(
        SCHEMA,
        {
            "motion/bin_failed": {"count": 1, "sum": list(range(8))},
            "obs/norm": {"count": 5, "sum": np.ones((2, 3), np.float32), "sumsq": np.full((1, 3), 2)},
            "curriculum/scale": {"value": 0.5},
        },
        Limits(),
    )
    assert decode(out["motion/bin_failed"]).tolist() == [1.0, *range(8)]  # count || sum, float64 LE
    norm = decode(out["obs/norm"])
    assert norm.size == 1 + 6 + 6
    assert (norm[7:] == 2).all()
    assert decode(out["curriculum/scale"]).tolist() == [0.5]


@pytest.mark.parametrize(
    ("report", "error", "words"),
    [
        ({"nope/key": {"value": 1}}, errors.UnknownKey, "nope/key"),
        ({"motion/bin_failed": {"count": 1, "sum": np.ones(7)}}, errors.ShapeMismatch, "shape (7,)"),
        ({"motion/bin_failed": {"count": 1, "sum": [0.0] * 7 + [np.nan]}}, errors.NonFiniteValue, "sum[7]"),
        ({"motion/bin_failed": {"count": 1, "sum": [np.inf] * 8}}, errors.NonFiniteValue, "inf"),
        ({"motion/bin_failed": {"count": -1, "sum": np.ones(8)}}, errors.NegativeValue, "count"),
        ({"motion/bin_failed": {"count": np.ones(8), "sum": np.ones(8)}}, errors.ShapeMismatch, "elementwise_count"),
        ({"terrain/levels": {"count": [1, 2, -1], "sum": 0}}, errors.NegativeValue, "count[2]"),
        ({"obs/norm": {"count": 1, "sum": 0, "sumsq": -np.ones((2, 3))}}, errors.NegativeValue, "sumsq"),
        ({"obs/norm": {"count": 1, "sum": 0}}, errors.MalformedReport, "tracks sumsq"),
        ({"motion/bin_failed": {"count": 1, "sum": 0, "extra": 1}}, errors.MalformedReport, "extra"),
        ({"motion/bin_failed": {"count": 1, "sum": "abc"}}, errors.MalformedReport, "str"),
        ({"motion/bin_failed": {"count": 1, "sum": ["0"] * 8}}, errors.MalformedReport, "expected numbers"),
        ({"motion/bin_failed": {"count": True, "sum": np.ones(8)}}, errors.MalformedReport, "bool"),
        ({"motion/bin_failed": {"count": 1, "sum": [None] * 8}}, errors.MalformedReport, "expected numbers"),
        ({"motion/bin_failed": {"value": 1}}, errors.MalformedReport, "motion/bin_failed"),
        ({"curriculum/scale": 3.0}, errors.MalformedReport, "mapping"),
        ({}, errors.MalformedReport, "non-empty"),
        ({7: {"value": 1}}, errors.MalformedReport, "str"),
    ],
)
def test_bad_reports_get_typed_errors_naming_key_and_problem(report, error, words):
    """A bad report is refused on the client with a typed error (a RedisyncError and a ValueError) naming the
    key and the problem."""
    with pytest.raises(error) as info:
        encode_reports(SCHEMA, report, Limits())
    assert isinstance(info.value, errors.RedisyncError)
    assert isinstance(info.value, ValueError)
    assert words in str(info.value)


def test_size_limit():
    """A report over the run's max_report_bytes is refused on the client, naming the limit."""
    with pytest.raises(errors.PayloadTooLarge, match="max_report_bytes=70"):
        encode_reports(SCHEMA, {"motion/bin_failed": {"count": 1, "sum": np.ones(8)}}, Limits(max_report_bytes=70))


_PLAIN_SCHEMA = Schema.of(
    {
        "motion/ema": merge(5, lifecycle="state"),
        "obs/norm": merge((2, 3), sumsq=True, lifecycle="history"),
        "bins/count": merge(4, elementwise_count=True, lifecycle="history"),
        "level/value": broadcast(3),
    }
)


def _by_models(name, raw):
    """What the models' way makes of one report: its payload bytes, or its error."""
    from redisync.store.codec import encode
    from redisync.store.schema import coerce_report

    spec = _PLAIN_SCHEMA.keys[name]
    try:
        return encode(coerce_report(name, spec, raw).vectors(name, spec))
    except errors.InvalidReport as e:
        return type(e), str(e)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # the float32 forms of values beyond it
def test_the_plain_way_of_a_report_agrees_with_the_models_on_everything():
    """Reports in the terms' own form take a numpy-only way (no model per report); for every value,
    shape and form, valid or not, the payload or the typed error must be the models' own."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    special = st.sampled_from([0.0, -0.0, 1.0, -1.0, 1e-300, 3e153, 2e154, 1e300, -1e300, np.inf, -np.inf, np.nan])
    number = st.one_of(st.floats(-1e6, 1e6), special)

    def array(shape):
        n = int(np.prod(shape))
        return st.lists(number, min_size=n, max_size=n).map(lambda v: np.array(v, dtype=np.float64).reshape(shape))

    def part(shape):  # mostly the right form; now and then a float32 array, a list, a wrong shape, an int
        return st.one_of(
            array(shape),
            array(shape),
            array(shape).map(lambda a: a.astype(np.float32)),
            array(shape).map(lambda a: a.tolist()),
            array((7,)),
            st.integers(-3, 3),
            number,
        )

    reports = st.one_of(
        st.fixed_dictionaries({"count": number, "sum": part((5,))}).map(lambda r: ("motion/ema", r)),
        st.fixed_dictionaries({"count": number, "sum": part((2, 3)), "sumsq": part((2, 3))}).map(
            lambda r: ("obs/norm", r)
        ),
        st.fixed_dictionaries({"count": part((2, 3)), "sum": part((2, 3))}).map(lambda r: ("obs/norm", r)),
        st.fixed_dictionaries({"count": part((4,)), "sum": part((4,))}).map(lambda r: ("bins/count", r)),
        st.fixed_dictionaries({"value": part((3,))}).map(lambda r: ("level/value", r)),
        st.fixed_dictionaries({"value": part((3,)), "extra": number}).map(lambda r: ("level/value", r)),
    )

    @settings(max_examples=examples(600), deadline=None)
    @given(reports)
    def agree(named):
        name, raw = named
        try:
            got = encode_reports(_PLAIN_SCHEMA, {name: raw}, Limits())[name]
        except errors.InvalidReport as e:
            got = type(e), str(e)
        assert got == _by_models(name, raw)

    agree()


@pytest.mark.extras("torch")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_half_precision_tensor_is_reported_as_its_exact_values(dtype, make_store):
    """A bfloat16 tensor was refused as 'not an array of numbers' (numpy has none): half-precision
    tensors are read as float32, which holds each of their values exactly, by both workers' checks."""
    import torch

    from redisync.collector.workers import new_syncer

    schema = Schema.of({"obs/norm": merge(3, lifecycle="history")})
    values = torch.tensor([0.5, 1.25, -3.0], dtype=getattr(torch, dtype))
    encoded = encode_reports(schema, {"obs/norm": {"count": 2, "sum": values}}, Limits(), 0)
    np.testing.assert_array_equal(decode(encoded["obs/norm"], 4), [2.0, 0.5, 1.25, -3.0])
    store = make_store()
    store.register(schema)

    class Half:
        def schema_entries(self):
            return dict(schema.keys)

        def report_shard_state(self):
            return {"obs/norm": {"count": torch.tensor(2, dtype=getattr(torch, dtype)), "sum": values}}

        def apply_shard_state(self, fleet):
            pass

    syncer = new_syncer(store, 0, [Half()], worker="thread").start()
    try:
        syncer.flush()
        assert syncer.wait_synced(timeout=20)
        assert syncer.health()["ok"], syncer.health()
    finally:
        syncer.stop()
    np.testing.assert_array_equal(store.fleet().keys["obs/norm"].parts()["sum"], [0.5, 1.25, -3.0])
