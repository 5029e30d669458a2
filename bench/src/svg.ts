/**
 * A dependency-free SVG writer for one kind of chart: grouped horizontal bars, one group per
 * scenario, one row per side, and a column of bars per metric (each group and column scaled on
 * its own, every bar labelled with its value). Plain SVG 1.1 with a white background and system
 * fonts, so that it reads the same in a browser, an editor and a forge's Markdown view.
 */

/** One row of a group: a side, its colour, and its value in each column (`null`: not measured). */
export interface Bar {
  readonly label: string
  readonly color: string
  readonly values: ReadonlyArray<number | null>
}

export interface Group {
  readonly title: string
  /** One line under the title, in grey (what the numbers are, what the scenario runs). */
  readonly note?: string | undefined
  readonly bars: ReadonlyArray<Bar>
}

export interface Column {
  /** The column's heading, e.g. "cycles/s (higher is better)". */
  readonly label: string
  readonly format: (value: number) => string
}

export interface BarChart {
  readonly title: string
  /** Lines under the title: the machine, the run. */
  readonly subtitle: ReadonlyArray<string>
  /** A line at the bottom, in grey: where the numbers come from. */
  readonly footer?: string | undefined
  readonly columns: ReadonlyArray<Column>
  readonly legend: ReadonlyArray<{ readonly name: string; readonly color: string }>
  readonly groups: ReadonlyArray<Group>
}

const font = "-apple-system, BlinkMacSystemFont, 'Segoe UI', Helvetica, Arial, sans-serif"
const width = 1040
const margin = 20
const labelWidth = 350
const columnGap = 24
/** Room kept right of the longest bar of a column for its value. */
const valueRoom = 76
const rowHeight = 20
const barHeight = 13
const ink = "#212529"
const grey = "#6c757d"
const rule = "#dee2e6"
/** The average width of a glyph, in em, for estimating the width of a text. */
const glyphWidth = 0.5

export const escapeXml = (text: string): string =>
  text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;")

type Attributes = Record<string, string | number>

const attributes = (attrs: Attributes): string =>
  Object.entries(attrs).map(([name, value]) => ` ${name}="${escapeXml(String(value))}"`).join("")

const element = (name: string, attrs: Attributes, content?: string): string =>
  content === undefined ? `<${name}${attributes(attrs)}/>` : `<${name}${attributes(attrs)}>${content}</${name}>`

const text = (x: number, y: number, content: string, attrs: Attributes = {}): string =>
  element("text", { x: round(x), y: round(y), ...attrs }, escapeXml(content))

const round = (n: number): number => Math.round(n * 10) / 10

/**
 * Shortens `label` to what fits in `room` pixels at `size`: no font metrics here, so an average
 * glyph of half an em stands for every one (the labels are mostly lower-case text).
 */
export const fitText = (label: string, room: number, size: number): string => {
  const fits = Math.floor(room / (size * glyphWidth))
  return label.length <= fits ? label : `${label.slice(0, Math.max(1, fits - 1))}…`
}

/** The chart as an SVG document. */
export const renderBarChart = (chart: BarChart): string => {
  const columnWidth = (width - 2 * margin - labelWidth - columnGap * chart.columns.length) / chart.columns.length
  const columnX = (i: number) => margin + labelWidth + columnGap + i * (columnWidth + columnGap)
  const parts: Array<string> = []
  let y = margin + 18
  parts.push(text(margin, y, chart.title, { "font-size": 20, "font-weight": 600, fill: ink }))
  for (const line of chart.subtitle) {
    y += 18
    parts.push(text(margin, y, line, { "font-size": 13, fill: grey }))
  }

  // legend: a swatch and a name each, wrapped to the width
  y += 24
  let x = margin
  for (const entry of chart.legend) {
    const room = entry.name.length * 13 * glyphWidth + 34
    if (x + room > width - margin) {
      x = margin
      y += 18
    }
    parts.push(element("rect", { x, y: y - 10, width: 12, height: 12, rx: 2, fill: entry.color }))
    parts.push(text(x + 17, y, entry.name, { "font-size": 13, fill: ink }))
    x += room
  }

  // column headings
  y += 30
  chart.columns.forEach((column, i) => {
    parts.push(text(columnX(i), y, fitText(column.label, columnWidth, 13), { "font-size": 13, "font-weight": 600, fill: ink }))
  })
  y += 8
  parts.push(element("line", { x1: margin, x2: width - margin, y1: y, y2: y, stroke: rule }))

  for (const group of chart.groups) {
    y += 24
    parts.push(text(margin, y, group.title, { "font-size": 14, "font-weight": 600, fill: ink }))
    if (group.note !== undefined) {
      y += 16
      parts.push(text(margin, y, fitText(group.note, width - 2 * margin, 12), { "font-size": 12, fill: grey }))
    }
    y += 8
    const maxima = chart.columns.map((_, i) =>
      Math.max(0, ...group.bars.map((bar) => bar.values[i] ?? 0).filter((v) => Number.isFinite(v)))
    )
    chart.columns.forEach((_, i) => {
      if (group.bars.every((bar) => bar.values[i] === null || bar.values[i] === undefined)) {
        parts.push(
          text(columnX(i), y + rowHeight * 0.75, "not measured in this scenario", { "font-size": 12, fill: grey, "font-style": "italic" })
        )
      }
    })
    for (const bar of group.bars) {
      const top = y + (rowHeight - barHeight) / 2
      parts.push(text(margin, top + barHeight - 2, fitText(bar.label, labelWidth - 8, 12), { "font-size": 12, fill: ink }))
      chart.columns.forEach((column, i) => {
        const value = bar.values[i]
        if (value === null || value === undefined) return
        const length = Number.isFinite(value) && maxima[i]! > 0 ? (Math.max(0, value) / maxima[i]!) * (columnWidth - valueRoom) : 0
        const x0 = columnX(i)
        parts.push(element("rect", { x: x0, y: round(top), width: round(Math.max(length, 1)), height: barHeight, rx: 2, fill: bar.color }))
        const label = Number.isFinite(value) ? column.format(value) : "–"
        parts.push(text(x0 + length + 5, top + barHeight - 2, label, { "font-size": 12, fill: ink }))
      })
      y += rowHeight
    }
    y += 4
    parts.push(element("line", { x1: margin, x2: width - margin, y1: y, y2: y, stroke: rule }))
  }

  if (chart.footer !== undefined) {
    y += 20
    parts.push(text(margin, y, fitText(chart.footer, width - 2 * margin, 12), { "font-size": 12, fill: grey }))
  }
  const height = Math.ceil(y + margin)
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="${escapeXml(font)}">`,
    element("rect", { x: 0, y: 0, width, height, fill: "#ffffff" }),
    ...parts,
    "</svg>",
    ""
  ].join("\n")
}
