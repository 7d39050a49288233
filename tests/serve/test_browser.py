"""The inbox page in a real browser: Debian's headless Chromium driven by Selenium through
Debian's chromedriver (``.ci/browser.sh`` installs both). Approve and discard from the page,
each handler runs once, the page follows changes without a reload, and it does all of it under
its Content-Security-Policy with nothing refused."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from pending_actions.producers import PendingActions
from pending_actions.serve.auth import Tokens
from tests.serve.conftest import Server
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
    # the console, to see every Content-Security-Policy refusal
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
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
    # browser refused nothing it asked for, and logged no error but its own favicon request
    console = driver.get_log("browser")  # type: ignore[attr-defined]
    refused = [e["message"] for e in console if "Content Security Policy" in e["message"]
               or (e["level"] == "SEVERE" and "/favicon.ico " not in e["message"])]
    assert refused == [], refused


def test_two_approvals_from_the_page(server: Server, pa: PendingActions, tokens: Tokens,
                                     browser: object) -> None:
    """An action its policy asks two people for shows its rule and "0 of 2 approvals"; the
    first person's button says it only adds an approval, and after the click the card reads
    "1 of 2 approvals: <name>"; the second person's click applies it, once, by that person."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support import expected_conditions as ec

    driver: WebDriver = browser  # type: ignore[assignment]
    tenant = f"web-{uuid.uuid4().hex[:6]}"
    pa.set_policy({"rules": [{"name": "two-people", "match": {"tool": "deploy"},
                              "decision": "ask", "approvals": 2}]}, tenant=tenant)
    alice, _a = tokens.create(tenant, "approver", name=f"alice-{uuid.uuid4().hex[:4]}")
    bob, who = tokens.create(tenant, "approver", name=f"bob-{uuid.uuid4().hex[:4]}")
    session = f"agent-{uuid.uuid4().hex[:4]}"
    action_id = pa.stage(session=session, tool="deploy", label="Deploy api", apply="t.ok",
                         tenant=tenant)
    wait = rerendered(driver)
    card = f'.action[data-id="{action_id}"]'

    def as_(token: str) -> None:
        driver.get(server.base + "/")
        driver.execute_script("sessionStorage.clear()")
        driver.get(server.base + "/")
        wait.until(ec.visibility_of_element_located((By.ID, "token"))).send_keys(token)
        driver.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, card)))

    def click(reason: str) -> None:
        driver.find_element(By.CSS_SELECTOR, f"{card} button.approve").click()
        wait.until(ec.visibility_of_element_located((By.ID, "reason"))).send_keys(reason)
        driver.find_element(By.ID, "confirm").click()

    as_(alice)
    line = driver.find_element(By.CSS_SELECTOR, f"{card} .policy").text
    assert "rule two-people" in line and "0 of 2 approvals" in line, line
    assert driver.find_element(By.CSS_SELECTOR, f"{card} button.approve").text == \
        "Add approval (1 of 2)"
    # alice's approval edits the payload: the notice says her edit is what comes next
    driver.find_element(By.CSS_SELECTOR, f"{card} button.approve").click()
    wait.until(ec.visibility_of_element_located((By.ID, "reason"))).send_keys("looks fine")
    driver.find_element(By.CSS_SELECTOR, "#edit-box summary").click()
    box = wait.until(ec.visibility_of_element_located((By.ID, "edit")))
    box.clear()
    box.send_keys('{"replicas": 3}')
    driver.find_element(By.ID, "confirm").click()
    wait.until(lambda d: "Approved 1 of 2" in d.find_element(By.ID, "notice").text)
    notice = driver.find_element(By.ID, "notice").text
    assert notice.startswith("Deploy api: Approved 1 of 2: alice") and notice.endswith(
        "(your edit of the payload is kept for the approvals to come)"), notice
    wait.until(lambda d: "1 of 2 approvals: alice" in d.find_element(
        By.CSS_SELECTOR, f"{card} .policy").text)
    assert runs(pa.client, session) == []

    as_(bob)
    assert driver.find_element(By.CSS_SELECTOR, f"{card} button.approve").text == \
        "Approve and apply"
    click("ship it")
    wait.until(ec.invisibility_of_element_located((By.CSS_SELECTOR, card)))
    assert [(r["id"], r["payload"]) for r in runs(pa.client, session)] == \
        [(action_id, {"replicas": 3})]
    assert [e.get("by") for e in pa.history(session) if e["event"] == "applied"] == [who.name]


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
