"""Test configuration shared by every test folder: Hypothesis profiles.

``dev`` (default) keeps property tests quick while editing and draws new examples every run, to find
new counterexamples; ``ci`` (``make test`` sets HYPOTHESIS_PROFILE=ci) runs more examples from a fixed
seed, so a CI result is reproducible. Neither has a deadline: timings belong in benchmarks.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=60, deadline=None)
settings.register_profile(
    "ci", max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
