"""deploy/ is documentation: its Compose file and Caddyfile must say what the cluster tests run."""

import re
import shlex

import yaml

from .helpers import PROJECT_DIR

DEPLOY = PROJECT_DIR / "deploy"


def runpool_options(command):
    """``{"--pool-size": "1", ...}`` and the flags of a runpool command line."""
    words = command if isinstance(command, list) else shlex.split(command)
    assert words[:3] == ["python", "manage.py", "runpool"], words
    options = {}
    for word, following in zip(words[3:], [*words[4:], None], strict=True):
        if word.startswith("--"):
            options[word] = following if following and not following.startswith("--") else True
    return options


def test_the_compose_file_runs_the_cluster_of_the_admission_tests():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    a, b = (runpool_options(services[name]["command"]) for name in ("a", "b"))
    # tests/test_cluster_admission.py: A with one unit, B with two, API keys required.
    assert (a["--pool-size"], b["--pool-size"]) == ("1", "2")
    assert "--allow-anonymous" not in a and "--allow-anonymous" not in b
    for name in ("a", "b"):
        environment = services[name]["environment"]
        assert environment["DATABASE_URL"].startswith("postgres://") and environment["REDIS_URL"].startswith("redis://")
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    # Each process's PUBLIC_URL is the prefix the proxy routes to it and to no other.
    caddy = (DEPLOY / "Caddyfile").read_text()
    routes = dict(re.findall(r"handle_path (/\w+)/\* \{\s*reverse_proxy (\w+):8000", caddy))
    for name, options in (("a", a), ("b", b)):
        prefix = options["--public-url"].removeprefix("wss://${S2S_HOST}")
        assert routes[prefix] == name
    assert {"--public-url"} < set(a) and services["caddy"]["ports"] == ["80:80", "443:443"]


def test_the_platform_waits_out_the_drain_of_a_sigterm():
    """Compose sends SIGTERM and kills after stop_grace_period: it must outlast the live calls'
    grace and the drain after it (pool.conf's defaults, which the compose file does not change)."""
    from pool.conf import DEFAULTS

    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for name in ("a", "b"):
        period = compose["services"][name]["stop_grace_period"]
        assert period.endswith("s") and "SHUTDOWN" not in compose["services"][name]["environment"]["S2S_JSON"]
        assert int(period[:-1]) > DEFAULTS["SHUTDOWN_GRACE_SECONDS"] + DEFAULTS["SHUTDOWN_DRAIN_SECONDS"]
