"""Headless Chromium (Debian's ``chromium`` package) driven by Playwright, no browser download."""

import contextlib
import shutil
from pathlib import Path

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
CHROMIUM_FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def chromium_path():
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        raise RuntimeError("Chromium is missing: install Debian's package with `apt-get install chromium` "
                           "(make test does this when run as root).")
    return path


@contextlib.contextmanager
def browser(extra_flags=()):
    """A Playwright Browser on the system Chromium."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=chromium_path(),
                                              args=CHROMIUM_FLAGS + list(extra_flags))
        try:
            yield chromium
        finally:
            chromium.close()


def screenshot_path(name):
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS / name


def admin_login(page, live, next_path):
    """Log ``page`` into ``live``'s admin and land on ``next_path``."""
    page.goto(f"{live.http_url}/admin/login/?next={next_path}")
    page.fill("#id_username", live.ADMIN[0])
    page.fill("#id_password", live.ADMIN[1])
    page.click("input[type=submit]")
    page.wait_for_url(f"**{next_path}")
