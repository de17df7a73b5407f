"""The Python benchmarks' link to the test harness: the services of a build
directory, started and driven as tests/services/services_test.py and
tests/e2e/e2e_test.py do (st and e2e below)."""
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
sys.path.insert(0, os.path.join(ROOT, "tests", "services"))
import services_test as st  # noqa: E402
import e2e_test as e2e  # noqa: E402


def use_build(build, prefix="tandem-bench-"):
    """Points the harness at the binaries of `build` and a fresh scratch
    directory (the services' logs); the demo pair as e2e's models."""
    b = os.path.abspath(build)

    class Args:
        cli = os.path.join(b, "services/cli/tandem")
        gateway = os.path.join(b, "services/gateway/tandem-gateway")
        verifier = os.path.join(b, "services/verifier/tandem-verifier")
        drafter = os.path.join(b, "services/drafter/tandem-drafter")
        source = ROOT

    st.ARGS = Args
    st.TMP = tempfile.mkdtemp(prefix=prefix)
    e2e.setup_paths()
    return Args
