/// <reference lib="dom" />
/**
 * A uPlot line chart over the last hour that follows its box's width and
 * its data.
 *
 * @module
 */
import type { JSX } from "preact";
import { useEffect, useRef } from "preact/hooks";
import uPlot from "uplot";

/** One line of a {@linkcode Chart}. */
export interface Line {
  label: string;
  color: string;
  /** How a value is shown on the axis and in the legend. */
  format?: (value: number) => string;
}

/**
 * @param props Its test id, title, lines, and data: times (s) then one
 *   array per line.
 * @returns The chart.
 */
export function Chart(
  props: { testid: string; title: string; lines: Line[]; data: number[][]; height?: number },
): JSX.Element {
  const box = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  const lineKey = props.lines.map((line) => line.label).join("|");
  useEffect(() => {
    const element = box.current;
    if (element === null) return;
    const format = props.lines[0]?.format ?? ((value: number) => String(value));
    const made = new uPlot(
      {
        title: props.title,
        width: Math.max(element.clientWidth, 200),
        height: props.height ?? 200,
        series: [
          {},
          ...props.lines.map((line) => ({
            label: line.label,
            stroke: line.color,
            width: 2,
            ...(line.format
              ? { value: (_u: uPlot, v: number) => v === null ? "–" : line.format!(v) }
              : {}),
          })),
        ],
        axes: [{}, { values: (_u: uPlot, ticks: number[]) => ticks.map(format), size: 70 }],
        // Always the last hour, and values from zero: one sample makes no
        // zoomed-in scale of years or of a hair's breadth.
        scales: {
          x: {
            time: true,
            range: (): uPlot.Range.MinMax => {
              const now = Date.now() / 1000;
              return [now - 3600, now];
            },
          },
          y: { range: (_u: uPlot, _min: number, max: number) => [0, Math.max(max * 1.1, 1)] },
        },
      },
      props.data as uPlot.AlignedData,
      element,
    );
    plot.current = made;
    const resize = (): void =>
      made.setSize({ width: Math.max(element.clientWidth, 200), height: props.height ?? 200 });
    addEventListener("resize", resize);
    return () => {
      removeEventListener("resize", resize);
      made.destroy();
      plot.current = null;
    };
  }, [lineKey, props.title]);
  useEffect(() => {
    plot.current?.setData(props.data as uPlot.AlignedData);
  }, [props.data]);
  return (
    <div class="chart" data-testid={props.testid} ref={box} role="img" aria-label={props.title} />
  );
}
