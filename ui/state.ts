/// <reference lib="dom" />
/**
 * The page's shared state: the one-line error, the long work in progress,
 * the confirm dialog's question, and the hash route. Each is a tiny store
 * with a hook, so any view can report without passing callbacks down.
 *
 * @module
 */
import { useEffect, useRef, useState } from "preact/hooks";
import { errorText } from "./api.ts";

type Listener = () => void;

/** A value views subscribe to. */
class Store<T> {
  #value: T;
  #listeners = new Set<Listener>();
  /** @param value The first value. */
  constructor(value: T) {
    this.#value = value;
  }
  /** @returns The value. */
  get(): T {
    return this.#value;
  }
  /** @param value The new value; every subscriber re-renders. */
  set(value: T): void {
    this.#value = value;
    for (const listener of this.#listeners) listener();
  }
  /**
   * @param listener Called on every change.
   * @returns Unsubscribes.
   */
  subscribe(listener: Listener): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }
}

/**
 * Re-renders the component when the store changes.
 *
 * @param store The store.
 * @returns Its value.
 */
export function useStore<T>(store: Store<T>): T {
  const [, tick] = useState(0);
  useEffect(() => store.subscribe(() => tick((n) => n + 1)), [store]);
  return store.get();
}

/** The one-line error shown under the header ("" for none). */
export const errorStore = new Store<string>("");

/**
 * Shows an error on one line.
 *
 * @param error Anything thrown.
 */
export function showError(error: unknown): void {
  errorStore.set(errorText(error));
}

/** One piece of long work: its label and its fraction done (null: unknown). */
export interface Work {
  id: number;
  label: string;
  done: number | null;
}

/** The long work in progress. */
export const workStore = new Store<Work[]>([]);
let nextWork = 1;

/**
 * Runs long work with a progress indicator; its failure is shown as the error.
 *
 * @param label What is being done.
 * @param run The work; it may report its fraction done.
 * @returns The work's result, or undefined when it failed.
 */
export async function withProgress<T>(
  label: string,
  run: (report: (done: number) => void) => Promise<T>,
): Promise<T | undefined> {
  const id = nextWork++;
  workStore.set([...workStore.get(), { id, label, done: null }]);
  const report = (done: number): void =>
    workStore.set(workStore.get().map((work) => work.id === id ? { ...work, done } : work));
  try {
    return await run(report);
  } catch (error) {
    showError(error);
    return undefined;
  } finally {
    workStore.set(workStore.get().filter((work) => work.id !== id));
  }
}

/** The question the confirm dialog asks, with its answer. */
export interface Question {
  text: string;
  confirm: string;
  answer: (yes: boolean) => void;
}

/** The open question, if any. */
export const questionStore = new Store<Question | null>(null);

/**
 * Asks in the confirm dialog.
 *
 * @param text The question.
 * @param confirm The confirm button's name.
 * @returns Whether the user confirmed.
 */
export function ask(text: string, confirm: string): Promise<boolean> {
  return new Promise((resolve) => {
    questionStore.get()?.answer(false);
    questionStore.set({
      text,
      confirm,
      answer: (yes) => {
        questionStore.set(null);
        resolve(yes);
      },
    });
  });
}

/** @returns The hash route's parts, e.g. `["sandbox", "abc", "files"]`. */
export function useRoute(): string[] {
  const read = (): string[] =>
    location.hash.replace(/^#\/?/, "").split("/").filter((part) => part !== "").map(
      decodeURIComponent,
    );
  const [route, setRoute] = useState(read);
  useEffect(() => {
    const changed = (): void => setRoute(read());
    addEventListener("hashchange", changed);
    return () => removeEventListener("hashchange", changed);
  }, []);
  return route;
}

/**
 * Calls `load` now and every `ms` while mounted and not paused; its result
 * is kept, its failure shown. A slow answer never overlaps the next call.
 *
 * @param load The request.
 * @param options How often, whether paused, and what it depends on.
 * @returns The newest result and a function to load again now.
 */
export function usePoll<T>(
  load: () => Promise<T>,
  options: { ms: number; paused?: boolean; deps: unknown[] },
): [T | undefined, () => void] {
  const [value, setValue] = useState<T | undefined>(undefined);
  const loadRef = useRef(load);
  loadRef.current = load;
  const [kick, setKick] = useState(0);
  const depsKey = useRef<string | undefined>(undefined);
  useEffect(() => {
    // New inputs (another directory, another sandbox): drop the old answer
    // rather than show it as theirs.
    const key = JSON.stringify(options.deps);
    if (depsKey.current !== undefined && depsKey.current !== key) setValue(undefined);
    depsKey.current = key;
    let stopped = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const run = async (): Promise<void> => {
      try {
        const next = await loadRef.current();
        if (!stopped) setValue(next);
      } catch (error) {
        if (!stopped) showError(error);
      }
      if (!stopped && options.paused !== true) timer = setTimeout(run, options.ms);
    };
    void run();
    return () => {
      stopped = true;
      clearTimeout(timer);
    };
  }, [...options.deps, options.paused, kick]);
  return [value, () => setKick((n) => n + 1)];
}
