/**
 * How the server and a pod's agent show each other the agent token without
 * sending it. The agent shares its pod's network with the runner, so while
 * the agent is down (a crash, an OOM kill, a restart) a command can bind its
 * port and be sent whatever the server sends the agent. So the token never
 * goes on the wire: each request carries, in `x-waffle-agent-token`, an
 * HMAC of it over the request (sandbox, method, path and query, time, a
 * fresh nonce), which the agent accepts once and only within
 * {@linkcode AGENT_PROOF_WINDOW_MS}; and the agent's answer carries, in
 * the same header, an HMAC over that proof, which the server checks before
 * it passes anything back. An impostor on the port learns a proof it cannot
 * replay, and its answers reach no client.
 *
 * @module
 */
import { hmac } from "@noble/hashes/hmac";
import { sha256 } from "@noble/hashes/sha2";
import { sameSecret } from "./secret.ts";

/** How far a proof's time may be from the agent's clock, either way, in ms. */
export const AGENT_PROOF_WINDOW_MS = 120_000;
/** Proofs the agent remembers (to refuse a replay) before it forgets the oldest. */
const REMEMBERED = 1 << 16;
const PROOF = /^v1\.(0|[1-9][0-9]{0,15})\.([A-Za-z0-9_-]{22})\.([0-9a-f]{64})$/;

/** What a proof covers of one request. */
export interface ProvenRequest {
  /** The sandbox id (its agent's `WAFFLE_SANDBOX_ID`). */
  id: string;
  /** The HTTP method. */
  method: string;
  /** The path and query, as sent. */
  target: string;
}

/** A request's proof, and the answer that proves the agent. */
export interface AgentProof {
  /** The request header's value. */
  header: string;
  /** What the agent's answer must carry in the same header. */
  answer: string;
}

function mac(token: string, text: string): string {
  const bytes = hmac(sha256, new TextEncoder().encode(token), new TextEncoder().encode(text));
  return Array.from(bytes, (byte) => byte.toString(16).padStart(2, "0")).join("");
}

function signed(request: ProvenRequest, time: string, nonce: string): string {
  return `waffle-agent-request\n${request.id}\n${request.method}\n${request.target}\n${time}\n${nonce}`;
}

function answerOf(token: string, header: string): string {
  return mac(token, `waffle-agent-answer\n${header}`);
}

/**
 * The server's proof of the agent token for one request (a fresh nonce).
 *
 * @param agentToken The sandbox's agent token.
 * @param request The request it covers.
 * @returns The header to send and the answer to expect.
 *
 * @example
 * ```ts
 * const proof = proveRequest("t".repeat(43), { id: "abc", method: "GET", target: "/health" });
 * proof.header.startsWith("v1."); // true
 * ```
 */
export function proveRequest(
  agentToken: string,
  request: ProvenRequest,
  options: { now?: number } = {},
): AgentProof {
  const time = String(options.now ?? Date.now());
  const nonce = btoa(String.fromCharCode(...crypto.getRandomValues(new Uint8Array(16))))
    .replaceAll("+", "-").replaceAll("/", "_").replace(/=+$/, "");
  const header = `v1.${time}.${nonce}.${mac(agentToken, signed(request, time, nonce))}`;
  return { header, answer: answerOf(agentToken, header) };
}

/**
 * Whether an agent's answer proves it holds the token.
 *
 * @param proof The request's proof.
 * @param answered The answer's header, or null.
 * @returns True when it is the expected answer.
 */
export function provesAgent(proof: AgentProof, answered: string | null): boolean {
  return answered !== null && sameSecret(answered, proof.answer);
}

/** The agent's side: each request's proof checked, and accepted once. */
export class AgentProofs {
  readonly #token: string;
  readonly #id: string;
  readonly #now: () => number;
  // Nonce → when it may be forgotten (its proof is stale by then).
  readonly #seen = new Map<string, number>();

  /**
   * @param agentToken The sandbox's agent token.
   * @param id The sandbox id.
   * @param options A clock (tests).
   */
  constructor(agentToken: string, id: string, options: { now?: () => number } = {}) {
    this.#token = agentToken;
    this.#id = id;
    this.#now = options.now ?? Date.now;
  }

  /**
   * Checks one request's proof and spends it.
   *
   * @param header The request's header, or null.
   * @param request The method and target the agent received.
   * @returns The answer header's value, or undefined when the proof is
   *   missing, wrong, stale or already spent.
   */
  accept(header: string | null, request: Omit<ProvenRequest, "id">): string | undefined {
    const match = header === null ? null : PROOF.exec(header);
    if (match === null) return undefined;
    const [, time, nonce, given] = match as unknown as [string, string, string, string];
    const now = this.#now();
    if (Math.abs(now - Number(time)) > AGENT_PROOF_WINDOW_MS) return undefined;
    const expected = mac(this.#token, signed({ id: this.#id, ...request }, time, nonce));
    if (!sameSecret(given, expected) || this.#seen.has(nonce)) return undefined;
    this.#forgetStale(now);
    this.#seen.set(nonce, Number(time) + AGENT_PROOF_WINDOW_MS);
    return answerOf(this.#token, header!);
  }

  #forgetStale(now: number): void {
    for (const [nonce, until] of this.#seen) {
      if (until >= now && this.#seen.size < REMEMBERED) break;
      this.#seen.delete(nonce);
    }
  }
}
