// The console's shell: sign-in, navigation by the URL's fragment, the error banner.
// Views are in namespaces.js, namespace.js and ops.js; each gets the signed-in Scopes.

import { ApiError, get, token } from "./api.js";
import { fill, h } from "./dom.js";
import { namespacesView } from "./namespaces.js";
import { namespaceView } from "./namespace.js";
import { opsView } from "./ops.js";
import { Scopes } from "./scopes.js";

const main = document.getElementById("main");
const errorBox = document.getElementById("error");
let who = null;

export function showError(err) {
  if (err instanceof ApiError && err.status === 401) {
    signOut(`Signed out: ${err.message}`);
    return;
  }
  errorBox.hidden = false;
  fill(errorBox, String(err && err.message ? err.message : err));
}

function clearError() {
  errorBox.hidden = true;
  errorBox.replaceChildren();
}

function signOut(message) {
  token.clear();
  who = null;
  renderSignIn(message);
}

function renderHeader() {
  const nav = document.getElementById("nav");
  const whoEl = document.getElementById("who");
  if (!who) {
    nav.replaceChildren();
    whoEl.replaceChildren();
    return;
  }
  fill(
    nav,
    h("a", { href: "#/" }, "Namespaces"),
    who.admin ? h("a", { href: "#/ops" }, "Operations") : null,
  );
  fill(
    whoEl,
    h("span", { class: "muted" }, "signed in as "),
    h("strong", { "data-token-name": "" }, who.name),
    h("span", { class: "scopes" }, who.scopes.join(" ")),
    h("button", { type: "button", onclick: () => signOut("Signed out.") }, "Sign out"),
  );
}

function renderSignIn(message) {
  renderHeader();
  const input = h("input", {
    name: "token",
    id: "token",
    type: "password",
    autocomplete: "off",
    spellcheck: "false",
    required: true,
    placeholder: "ckpt_…",
  });
  const note = h("p", { class: "muted" }, message || "");
  // method=post: were the script not running, a submitted form still puts no token in a URL
  const form = h(
    "form",
    { id: "signin", method: "post", onsubmit: (ev) => signIn(ev, input, note) },
    h("h1", {}, "Sign in"),
    h("label", { for: "token" }, "Token"),
    input,
    h("button", { type: "submit" }, "Sign in"),
    note,
    h("p", { class: "muted small" },
      "The token stays in this tab (sessionStorage) and goes only in the Authorization header."),
  );
  fill(main, form);
  input.focus();
}

async function signIn(ev, input, note) {
  ev.preventDefault();
  clearError();
  token.set(input.value.trim());
  try {
    who = new Scopes(await get("/v1/whoami"));
  } catch (err) {
    token.clear();
    note.textContent = err instanceof ApiError ? err.message : String(err);
    return;
  }
  input.value = "";
  renderHeader();
  route();
}

async function route() {
  if (!who) return;
  clearError();
  const view = h("div", { class: "view" });
  fill(main, view);
  try {
    const frag = decodeURIComponent(location.hash.replace(/^#/, "")) || "/";
    if (frag.startsWith("/ns/")) {
      const [ns, query] = frag.slice(4).split("?");
      const selected = new URLSearchParams(query || "").get("c");
      await namespaceView(view, who, ns, selected, showError);
    } else if (frag === "/ops" && who.admin) {
      await opsView(view, who, showError);
    } else {
      await namespacesView(view, who, showError);
    }
    main.setAttribute("data-ready", frag);
  } catch (err) {
    showError(err);
  }
}

async function start() {
  window.addEventListener("hashchange", () => route().catch(showError));
  if (!token.get()) {
    renderSignIn();
    return;
  }
  try {
    who = new Scopes(await get("/v1/whoami"));
  } catch (err) {
    signOut(err.message);
    return;
  }
  renderHeader();
  await route();
}

start().catch(showError);
