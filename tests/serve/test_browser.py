"""The inbox page in a real browser: Debian's headless Chromium driven by Selenium through
Debian's chromedriver (``.ci/browser.sh`` installs both). Approve and discard from the page,
each handler runs once, the page follows changes without a reload, and it does all of it under
its Content-Security-Policy with nothing refused."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from pending_actions.procs import ROOT
from pending_actions.producers import PendingActions
from pending_actions.serve.auth import Tokens
from tests.serve.conftest import Server
from tests.support.procs import worker_env
from tests.support.runs import runs

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver") or (
    "/usr/bin/chromedriver" if Path("/usr/bin/chromedriver").exists() else None)
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="needs Debian's chromium and chromium-driver (run .ci/browser.sh as root)")

DIFF = """--- a/deploy.yaml
+++ b/deploy.yaml
@@ -1,4 +1,4 @@
 service: api
-replicas: 2
+replicas: 4
 image: api:1.8
-region: eu-west-1
+region: eu-central-1
"""


@pytest.fixture
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,1000"):
        options.add_argument(arg)
    # the console, to see every Content-Security-Policy refusal; the network (DevTools'
    # events), to see every request the page made and what it got
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)),
                              options=options)
    try:
        yield driver
    finally:
        driver.quit()


def rerendered(driver: object) -> Any:
    """A wait on the inbox page, which renders its list again as it refreshes: an element found
    a moment before may be replaced by the time its text is read (stale), and is looked up
    again, as a missing one is."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, 20,
                         ignored_exceptions=(NoSuchElementException,
                                             StaleElementReferenceException))


def test_approve_and_discard_from_the_page(server: Server, pa: PendingActions, tokens: Tokens,
                                           browser: object, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support import expected_conditions as ec

    driver: WebDriver = browser  # type: ignore[assignment]
    tenant = f"web-{uuid.uuid4().hex[:6]}"
    token, who = tokens.create(tenant, "approver", name=f"alice-{uuid.uuid4().hex[:4]}")
    deploy, chat = f"agent-deploy-{uuid.uuid4().hex[:4]}", f"agent-chat-{uuid.uuid4().hex[:4]}"
    old = pa.stage(session=deploy, tool="shell", label="Run migrations", apply="t.ok",
                   payload={"command": "alembic upgrade head"}, tenant=tenant)
    edit = pa.stage(session=deploy, tool="edit", label="Scale the API to 4 replicas",
                    apply="t.ok", payload={"path": "deploy.yaml", "diff": DIFF}, tenant=tenant)
    mail = pa.stage(session=chat, tool="email", label="Send the weekly report",
                    apply="t.ok", reject="t.reject_text",
                    payload={"to": "team@example.com", "subject": "Weekly report"},
                    tenant=tenant)
    wait = rerendered(driver)

    def card(action_id: str) -> str:
        return f'.action[data-id="{action_id}"]'

    driver.get(server.base + "/")
    wait.until(ec.visibility_of_element_located((By.ID, "token"))).send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, card(mail))))
    assert not driver.find_element(By.ID, "login").is_displayed()
    assert not driver.find_element(By.ID, "empty").is_displayed()
    # newest first, grouped by session; only each session's head can be acted on
    sessions = [e.get_attribute("data-session")
                for e in driver.find_elements(By.CSS_SELECTOR, "section.session")]
    assert sessions == [chat, deploy]
    order = [e.get_attribute("data-id") for e in driver.find_elements(By.CSS_SELECTOR, ".action")]
    assert order == [mail, edit, old]
    assert not driver.find_element(By.CSS_SELECTOR, card(old) + " button.approve").is_enabled()
    added = driver.find_elements(By.CSS_SELECTOR, card(edit) + " pre.diff .add")
    assert [e.text for e in added] == ["+replicas: 4", "+region: eu-central-1"]
    assert who.name in driver.find_element(By.ID, "who").text
    shot = tmp_path / "inbox.png"
    driver.save_screenshot(str(shot))
    shutil.copy(shot, "/tmp/inbox.png")

    def decide(action_id: str, button: str, reason: str) -> None:
        driver.find_element(By.CSS_SELECTOR, f"{card(action_id)} button.{button}").click()
        box = wait.until(ec.visibility_of_element_located((By.ID, "reason")))
        box.send_keys(reason)
        driver.find_element(By.ID, "confirm").click()
        # the card goes away on its own: the page polls, nobody reloads it
        wait.until(ec.invisibility_of_element_located((By.CSS_SELECTOR, card(action_id))))

    decide(edit, "approve", "capacity for the launch")
    # the handler's text, led by the label (it does not name it)
    wait.until(lambda d: d.find_element(By.ID, "notice").text ==
               f"Scale the API to 4 replicas: applied {edit}")
    # the older action of that session is now its head, so its buttons come alive
    wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, card(old) + " button.approve")))
    decide(mail, "discard", "not this week")
    # a text that names the label already is not led by it again (issue 41, item 10)
    wait.until(lambda d: d.find_element(By.ID, "notice").text ==
               "rejected Send the weekly report because not this week")

    # staged while the page is open: it appears without a reload
    late = pa.stage(session=chat, tool="email", label="Send the monthly report", apply="t.ok",
                    tenant=tenant)
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, card(late))))
    driver.save_screenshot(str(tmp_path / "inbox-after.png"))

    assert [(r["handler"], r["id"], r["reason"]) for r in runs(pa.client, deploy)] == \
        [("t.ok", edit, "capacity for the launch")]
    assert [(r["handler"], r["id"], r["reason"]) for r in runs(pa.client, chat)] == \
        [("t.reject_text", mail, "not this week")]
    assert [a.id for a in pa.pending(deploy)] == [old]
    assert [a.id for a in pa.pending(chat)] == [late]
    outcomes = [(e["event"], e["id"], e.get("by")) for e in pa.history(deploy) + pa.history(chat)
                if e["event"] in ("applied", "discarded")]
    assert outcomes == [("applied", edit, who.name), ("discarded", mail, who.name)]
    # the page works under its Content-Security-Policy (no inline script or style): the
    # browser refused nothing it asked for, and logged no error (a missing favicon is one)
    console = driver.get_log("browser")  # type: ignore[attr-defined]
    refused = [e["message"] for e in console if "Content Security Policy" in e["message"]
               or e["level"] == "SEVERE"]
    assert refused == [], refused


def test_two_approvals_from_the_page(server: Server, pa: PendingActions, tokens: Tokens,
                                     browser: object, tmp_path: Path) -> None:
    """An action its policy asks two people for shows its rule and that it waits for two
    approvers; the first person's button says it only adds an approval. After the click the
    card reads "Approved by <name> (1 of 2); waiting for 1 more approver", and that person's
    page, reloaded too, offers no approve button (a second click would count nothing) but says
    what it waits for; a discard stays offered, saying it sets the approval aside. The second
    person's click applies it, once, by that person."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support import expected_conditions as ec

    driver: WebDriver = browser  # type: ignore[assignment]
    tenant = f"web-{uuid.uuid4().hex[:6]}"
    pa.set_policy({"rules": [{"name": "two-people", "match": {"tool": "deploy"},
                              "decision": "ask", "approvals": 2}]}, tenant=tenant)
    alice, first = tokens.create(tenant, "approver", name=f"alice-{uuid.uuid4().hex[:4]}")
    bob, who = tokens.create(tenant, "approver", name=f"bob-{uuid.uuid4().hex[:4]}")
    session = f"agent-{uuid.uuid4().hex[:4]}"
    # with a reject handler, a discard runs it: it needs the two approvals as well
    action_id = pa.stage(session=session, tool="deploy", label="Deploy api", apply="t.ok",
                         reject="t.reject_text", payload={"image": "api:2"}, tenant=tenant)
    wait = rerendered(driver)
    card = f'.action[data-id="{action_id}"]'

    def as_(token: str) -> None:
        driver.get(server.base + "/")
        driver.execute_script("sessionStorage.clear()")
        driver.get(server.base + "/")
        wait.until(ec.visibility_of_element_located((By.ID, "token"))).send_keys(token)
        driver.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, card)))

    def text(css: str) -> str:
        return driver.find_element(By.CSS_SELECTOR, f"{card} {css}").text

    def click(button: str, reason: str) -> None:
        driver.find_element(By.CSS_SELECTOR, f"{card} button.{button}").click()
        wait.until(ec.visibility_of_element_located((By.ID, "reason"))).send_keys(reason)

    as_(alice)
    line = text(".policy")
    assert "rule two-people" in line and "Waiting for 2 approvers (0 of 2)" in line, line
    assert text("button.approve") == "Add approval (1 of 2)"
    assert text("button.discard") == "Add discard approval (1 of 2)"
    # alice's approval edits the payload: the notice says her edit is what comes next
    click("approve", "looks fine")
    driver.find_element(By.CSS_SELECTOR, "#edit-box summary").click()
    box = wait.until(ec.visibility_of_element_located((By.ID, "edit")))
    box.clear()
    box.send_keys('{"replicas": 3}')
    driver.find_element(By.ID, "confirm").click()
    wait.until(lambda d: "Approved 1 of 2" in d.find_element(By.ID, "notice").text)
    notice = driver.find_element(By.ID, "notice").text
    assert notice.startswith("Deploy api: Approved 1 of 2: alice") and notice.endswith(
        "(your edit of the payload is kept for the approvals to come)"), notice
    approved = f"Approved by {first.name} (1 of 2); waiting for 1 more approver"
    wait.until(lambda d: approved in d.find_element(By.CSS_SELECTOR, f"{card} .policy").text)
    for _ in ("as the click left it", "as the server says it after a reload"):
        assert driver.find_elements(By.CSS_SELECTOR, f"{card} button.approve") == []
        assert text(".mine.approve") == \
            "You approved this; it applies once 1 more approver approves"
        assert text("button.discard") == "Add discard approval (1 of 2)"
        driver.save_screenshot(str(tmp_path / "approved-1-of-2.png"))
        driver.refresh()
        wait.until(lambda d: approved in d.find_element(By.CSS_SELECTOR, f"{card} .policy").text)
    shutil.copy(tmp_path / "approved-1-of-2.png", "/tmp/inbox-approved-by-me.png")
    # a discard is still hers to start, and the dialog says what it does to her approval
    click("discard", "changed my mind")
    note = driver.find_element(By.ID, "decide-note").text
    assert note.startswith(f"This sets aside the approvals to apply ({first.name})"), note
    driver.save_screenshot("/tmp/inbox-discard-sets-aside.png")
    driver.find_element(By.ID, "cancel").click()
    assert runs(pa.client, session) == []

    as_(bob)
    assert approved in text(".policy")
    assert text("button.approve") == "Approve and apply"
    assert driver.find_elements(By.CSS_SELECTOR, f"{card} .mine") == []
    driver.save_screenshot("/tmp/inbox-approved-by-other.png")
    click("approve", "ship it")
    # an edit would start the approvals again: the dialog names whose it would set aside
    assert first.name in (driver.find_element(By.ID, "edit-note").get_attribute("textContent")
                          or "")
    driver.find_element(By.ID, "confirm").click()
    wait.until(ec.invisibility_of_element_located((By.CSS_SELECTOR, card)))
    assert [(r["id"], r["payload"]) for r in runs(pa.client, session)] == \
        [(action_id, {"replicas": 3})]
    assert [e.get("by") for e in pa.history(session) if e["event"] == "applied"] == [who.name]


def test_a_sign_in_link(server: Server, redis_server: Any, pa: PendingActions,
                        browser: object) -> None:
    """The link ``token create`` prints opens the page signed in, and the token leaves the
    address at once; the server never gets it in a URL (a fragment is never sent). A link with a
    revoked or unknown token shows the form with why. Loading the page requests nothing that
    is not there: its favicon is served."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support import expected_conditions as ec

    driver: WebDriver = browser  # type: ignore[assignment]
    tenant = f"web-{uuid.uuid4().hex[:6]}"
    made = subprocess.run(
        [sys.executable, "-m", "pending_actions", "--json", "token", "create", "--tenant",
         tenant, "--role", "approver", "--inbox-url", server.base + "/"],
        env=worker_env(redis_server.url), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    token = orjson.loads(made.stdout)
    session = f"agent-{uuid.uuid4().hex[:4]}"
    action_id = pa.stage(session=session, tool="email", label="Send it", apply="t.ok",
                         tenant=tenant)
    wait = rerendered(driver)
    network: list[dict[str, Any]] = []

    def heard() -> list[dict[str, Any]]:
        """DevTools' network events so far (the log hands each one over once)."""
        for entry in driver.get_log("performance"):  # type: ignore[attr-defined]
            message = orjson.loads(entry["message"])["message"]
            if message["method"].startswith("Network."):
                network.append(message)
        return network

    def got(path: str) -> list[int]:
        return [m["params"]["response"]["status"] for m in heard()
                if m["method"] == "Network.responseReceived"
                and m["params"]["response"]["url"] == server.base + path]

    driver.get(token["link"])
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, f'[data-id="{action_id}"]')))
    assert token["name"] in driver.find_element(By.ID, "who").text
    assert not driver.find_element(By.ID, "login").is_displayed()
    assert driver.current_url == server.base + "/"
    assert driver.execute_script("return location.hash") == ""
    assert driver.execute_script("return sessionStorage.getItem('pa-token')") == token["token"]
    # the favicon is asked for once the page has loaded: wait for its answer, then nothing
    # the page asked for may have failed, and no URL it asked for may hold the token
    wait.until(lambda _d: got("/static/favicon.svg") == [200])
    failed = [(m["params"]["response"]["url"], m["params"]["response"]["status"])
              for m in heard() if m["method"] == "Network.responseReceived"
              and m["params"]["response"]["status"] >= 400]
    assert failed == [], failed
    urls = [m["params"]["request"]["url"] for m in heard()
            if m["method"] == "Network.requestWillBeSent"]
    assert server.base + "/" in urls and "/favicon.ico" not in " ".join(urls), urls
    assert not [u for u in urls if token["token"] in u or "token=" in u], urls
    # signed in for the tab's life, as with the form: a reload keeps it, the address stays clean
    driver.refresh()
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, f'[data-id="{action_id}"]')))
    assert driver.current_url == server.base + "/"
    driver.save_screenshot("/tmp/inbox-link.png")

    # a producer's token (a program's) sees the inbox but is offered no decision: the server
    # would refuse it (403)
    producer = subprocess.run(
        [sys.executable, "-m", "pending_actions", "--json", "token", "create", "--tenant",
         tenant, "--role", "producer"],
        env=worker_env(redis_server.url), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert producer.returncode == 0, producer.stderr
    driver.execute_script("sessionStorage.setItem('pa-token', arguments[0])",
                          orjson.loads(producer.stdout)["token"])
    driver.refresh()
    card = wait.until(ec.presence_of_element_located(
        (By.CSS_SELECTOR, f'[data-id="{action_id}"]')))
    assert "producer" in driver.find_element(By.ID, "who").text
    assert card.find_elements(By.TAG_NAME, "button") == []
    assert "may look, not decide" in card.text, card.text
    driver.save_screenshot("/tmp/inbox-producer.png")
    driver.execute_script("sessionStorage.setItem('pa-token', arguments[0])", token["token"])
    driver.refresh()
    wait.until(ec.presence_of_element_located(
        (By.CSS_SELECTOR, f'[data-id="{action_id}"] button')))

    # a link opened where the page is open already changes only the fragment (no reload)
    driver.get(server.base + "/#token=pat_not-a-token")
    wait.until(lambda d: d.find_element(By.ID, "login-error").text == "invalid or revoked token")
    assert driver.current_url == server.base + "/"
    assert driver.execute_script("return sessionStorage.getItem('pa-token')") is None
    assert driver.find_elements(By.CSS_SELECTOR, ".action") == []
    driver.save_screenshot("/tmp/inbox-link-refused.png")
    console = driver.get_log("browser")  # type: ignore[attr-defined]
    # the one error the console may hold: the refused inbox request of the bad token
    errors = [e["message"] for e in console if e["level"] == "SEVERE"
              and "/v1/inbox - Failed to load resource: the server responded with a status "
                  "of 401" not in e["message"]]
    assert errors == [], errors


def test_an_edit_from_the_page(server: Server, pa: PendingActions, tokens: Tokens,
                               browser: object) -> None:
    """The approve dialog shows the payload as JSON: text that is not a JSON object is refused
    in the dialog (nothing sent); an edited payload goes as a merge patch, the handler runs once
    on it, and the history keeps the patch."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support import expected_conditions as ec

    driver: WebDriver = browser  # type: ignore[assignment]
    tenant = f"web-{uuid.uuid4().hex[:6]}"
    token, who = tokens.create(tenant, "approver", name=f"dana-{uuid.uuid4().hex[:4]}")
    session = f"agent-{uuid.uuid4().hex[:4]}"
    action_id = pa.stage(session=session, tool="deploy", label="Scale api", apply="t.ok",
                         payload={"replicas": 2, "image": "api:1", "region": "eu"},
                         tenant=tenant)
    wait = rerendered(driver)
    card = f'.action[data-id="{action_id}"]'
    driver.get(server.base + "/")
    wait.until(ec.visibility_of_element_located((By.ID, "token"))).send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, card)))
    driver.find_element(By.CSS_SELECTOR, f"{card} button.approve").click()
    wait.until(ec.visibility_of_element_located((By.ID, "reason"))).send_keys("fewer, same image")
    driver.find_element(By.CSS_SELECTOR, "#edit-box summary").click()
    box = wait.until(ec.visibility_of_element_located((By.ID, "edit")))
    assert orjson.loads(box.get_attribute("value") or "") == {"replicas": 2, "image": "api:1",
                                                                "region": "eu"}
    box.clear()
    box.send_keys('{"replicas": 1,')
    driver.find_element(By.ID, "confirm").click()
    wait.until(lambda d: "not JSON" in d.find_element(By.ID, "edit-error").text)
    assert driver.find_element(By.ID, "decide").is_displayed() and runs(pa.client, session) == []
    box.clear()
    box.send_keys('{"replicas": 1, "image": "api:1"}')
    driver.save_screenshot("/tmp/inbox-edit.png")
    driver.find_element(By.ID, "confirm").click()
    wait.until(ec.invisibility_of_element_located((By.CSS_SELECTOR, card)))
    # the notice says the edit went in (issue 41, item 10)
    wait.until(lambda d: d.find_element(By.ID, "notice").text ==
               f"Scale api: applied {action_id} (applied with your edit of the payload)")
    [run] = runs(pa.client, session)
    assert run["id"] == action_id and run["payload"] == {"replicas": 1, "image": "api:1"}
    [applied] = [e for e in pa.history(session) if e["event"] == "applied"]
    assert applied["by"] == who.name
    assert orjson.loads(applied["edit"]) == {"replicas": 1, "region": None}
