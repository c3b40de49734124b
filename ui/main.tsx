/// <reference lib="dom" />
/**
 * waffle's console: sign in with an API key (kept in sessionStorage, sent
 * as `X-API-Key`), then the hash routes `#/sandboxes`, `#/sandbox/<id>[/<tab>]`
 * and `#/audit[/egress|/mcp]`.
 *
 * @module
 */
import "@xterm/xterm/css/xterm.css";
import "uplot/dist/uPlot.min.css";
import "./style.css";
import { type JSX, render } from "preact";
import { useEffect, useState } from "preact/hooks";
import { api, ApiError, currentKey, errorText, setKey } from "./api.ts";
import { errorStore, showError, useRoute } from "./state.ts";
import type { WhoAmI } from "./types.ts";
import { AuditView } from "./views/audit.tsx";
import { ConfirmDialog, ErrorLine, ProgressList } from "./views/common.tsx";
import { SandboxView } from "./views/sandbox.tsx";
import { SandboxesView } from "./views/sandboxes.tsx";

function App(): JSX.Element {
  const [who, setWho] = useState<WhoAmI | null>(null);
  const [checking, setChecking] = useState(currentKey() !== "");
  useEffect(() => {
    if (currentKey() === "") return;
    api<WhoAmI>("GET", "/waffle/v1/whoami").then(setWho).catch((error) => {
      if (error instanceof ApiError && error.status === 401) setKey("");
      showError(error);
    }).finally(() => setChecking(false));
  }, []);
  const signOut = (): void => {
    setKey("");
    setWho(null);
    errorStore.set("");
    location.hash = "";
    // Nothing the old key fetched (tokens, views' state) may outlive it in this tab.
    location.reload();
  };
  if (who === null) {
    return (
      <>
        <ErrorLine />
        {checking ? <p class="muted">Signing in…</p> : <Login onWho={setWho} />}
      </>
    );
  }
  return (
    <>
      <header>
        <a class="brand" href="#/sandboxes">waffle</a>
        <nav aria-label="Main">
          <a href="#/sandboxes">Sandboxes</a>
          <a href="#/audit">Audit</a>
        </nav>
        <span data-testid="whoami" class="whoami">
          {who.tenant}
          {who.admin ? " (admin)" : ""}
        </span>
        <button type="button" data-testid="logout" onClick={signOut}>Sign out</button>
      </header>
      <ErrorLine />
      <ProgressList />
      <main>
        <Routed who={who} />
      </main>
      <ConfirmDialog />
    </>
  );
}

function Routed(props: { who: WhoAmI }): JSX.Element {
  const route = useRoute();
  if (route[0] === "sandbox" && route[1] !== undefined) {
    return <SandboxView key={route[1]} id={route[1]} tab={route[2]} who={props.who} />;
  }
  if (route[0] === "audit") return <AuditView tab={route[1] ?? "egress"} />;
  return <SandboxesView who={props.who} />;
}

function Login(props: { onWho: (who: WhoAmI) => void }): JSX.Element {
  const [value, setValue] = useState("");
  const [busy, setBusy] = useState(false);
  const submit = async (event: Event): Promise<void> => {
    event.preventDefault();
    setBusy(true);
    setKey(value.trim());
    try {
      const who = await api<WhoAmI>("GET", "/waffle/v1/whoami");
      errorStore.set("");
      if (location.hash === "" || location.hash === "#") location.hash = "#/sandboxes";
      props.onWho(who);
    } catch (error) {
      setKey("");
      errorStore.set(errorText(error));
    } finally {
      setBusy(false);
    }
  };
  return (
    <main class="login">
      <h1>waffle console</h1>
      <form onSubmit={submit}>
        <label for="key">API key</label>
        <input
          id="key"
          type="password"
          autocomplete="off"
          required
          value={value}
          onInput={(event) => setValue(event.currentTarget.value)}
        />
        <button type="submit" data-testid="login-submit" disabled={busy}>Sign in</button>
      </form>
    </main>
  );
}

render(<App />, document.getElementById("app")!);
