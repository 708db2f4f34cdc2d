"""Test configuration shared by every test folder: Hypothesis profiles.

``dev`` (default) keeps property tests quick while editing; ``ci`` (selected by ``.ci/run`` through
HYPOTHESIS_PROFILE=ci) runs more examples. Neither has a deadline: timings belong in benchmarks.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=60, deadline=None)
settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
