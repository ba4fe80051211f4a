"""What to measure is parsed and checked once (profiler/options), before anything runs."""

from __future__ import annotations

import pytest
from greenctl.data.errors import InputError
from greenctl.profiler.options import (
    DEFAULT_DURATION_S,
    ProfileOptions,
    UserModelSpec,
    parse_int_list,
    parse_profile_options,
)


def test_the_command_line_text_becomes_options():
    opts = parse_profile_options(
        variants=["tiny-s,tiny-m", " tiny-l "], cpus="1,2", batch="1,4", mps="25,50"
    )
    assert opts == ProfileOptions(
        variants=("tiny-s", "tiny-m", "tiny-l"),
        cpus=(1, 2),
        batches=(1, 4),
        mps=(25, 50),
        duration_s=DEFAULT_DURATION_S,
    )
    counted = parse_profile_options(model="tiny", requests=50)
    assert counted.family == "tiny" and counted.requests == 50 and counted.duration_s is None
    assert parse_profile_options(cpus="none", gpus=True).cpus == ()


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"duration": 1.0, "requests": 5}, "either --duration or --requests"),
        ({"requests": 0}, "--requests 0"),
        ({"duration": -1.0}, "--duration must be a positive number"),
        ({"user": UserModelSpec(input_shape="3,32,32")}, "--input-shape only applies"),
        ({"emulate_mig": True}, "--emulate-mig needs --gpus"),
        ({"cpus": "none"}, "--cpus none"),
        ({"batch": "1,x"}, "--batch: 'x'"),
        ({"mps": "50,200", "gpus": True}, "between 1 and 100"),
    ],
)
def test_bad_choices_are_refused_naming_the_flag(kwargs, says):
    with pytest.raises(InputError, match=says.replace("(", r"\(")):
        parse_profile_options(**kwargs)


def test_int_lists_need_a_whole_number_each():
    assert parse_int_list(" 1, 2, 4 ", option="--cpus") == [1, 2, 4]
    # an empty item is a typo, not a separator: refused as data.limits.split_items says
    with pytest.raises(InputError, match="--batch 1,,2 holds an empty item"):
        parse_int_list("1,,2", option="--batch")
    with pytest.raises(InputError, match="--cpus is empty"):
        parse_int_list(" , ", option="--cpus")
    for kwargs in ({"variants": ["tiny-s,"]}, {"mps": "25,", "gpus": True}):
        with pytest.raises(InputError, match="holds an empty item"):
            parse_profile_options(**kwargs)
    with pytest.raises(InputError, match="--duration must be a positive number"):
        parse_profile_options(variants=["tiny-s"], duration=-1.0)
    with pytest.raises(InputError, match="'0' is not a whole number"):
        parse_int_list("0", option="--batch")


def test_keywords_build_the_same_options_as_the_type():
    """``profile(store, variants=..., cpus=...)`` callers get what ProfileOptions says."""
    built = ProfileOptions.of(variants=["tiny-s"], cpus=[1], batches=[1, 2], mps=[25], gpus=True)
    assert built == ProfileOptions(
        variants=("tiny-s",), cpus=(1,), batches=(1, 2), mps=(25,), gpus=True
    )
    with pytest.raises(InputError, match="--emulate-mig needs --gpus"):
        ProfileOptions(emulate_mig=True).check()
    with pytest.raises(InputError, match="--batch 0"):
        ProfileOptions(batches=(0,)).check()
    with pytest.raises(InputError, match="--duration must be a positive"):
        ProfileOptions(duration_s=None).check()
