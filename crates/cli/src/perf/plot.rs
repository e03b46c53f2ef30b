//! PNG line charts for the perf reports (no system fonts, no external tools).
//!
//! Contract: [`write_png`] draws every [`Series`] of a [`Chart`] as a line
//! with point markers, axes with tick labels (log scale when asked), a title
//! and a legend, and writes an RGB PNG to `path`.
//!
//! Everything is done here: a software rasteriser (lines of width 2,
//! square markers), a 5×7 bitmap font of printable ASCII (drawn at
//! scale 2; other characters show as `?`), and a PNG encoder (zlib with
//! fixed-Huffman deflate and run/row-above matches, CRC-32, Adler-32).
//! Points that cannot be drawn (NaN, infinite, ≤ 0 on a log axis) are
//! skipped and a line is broken there; a chart without any drawable
//! point still gets its frame, title and a "no data" note.
//!
//! Output: [`WIDTH`] × [`HEIGHT`] pixels, 8-bit RGB, white background.

use std::io;
use std::path::Path;

/// One named line of a chart.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// (x, y) points, in drawing order.
    pub points: Vec<(f64, f64)>,
}

/// What to draw.
#[derive(Clone, Debug)]
pub struct Chart<'a> {
    /// Title above the plot area.
    pub title: &'a str,
    /// Label under the x axis.
    pub x_label: &'a str,
    /// Label beside the y axis.
    pub y_label: &'a str,
    /// Logarithmic x axis (sizes).
    pub log_x: bool,
    /// Logarithmic y axis.
    pub log_y: bool,
    /// The lines.
    pub series: &'a [Series],
}

/// Image width, pixels.
pub const WIDTH: usize = 1000;
/// Image height, pixels.
pub const HEIGHT: usize = 600;

/// Renders `chart` to a PNG file at `path`.
pub fn write_png(chart: &Chart<'_>, path: &Path) -> io::Result<()> {
    let img = render(chart);
    std::fs::write(path, encode_png(&img.px, img.w, img.h))
}

// ---------------------------------------------------------------------------
// Canvas
// ---------------------------------------------------------------------------

type Rgb = [u8; 3];

const BLACK: Rgb = [0, 0, 0];
const GRID: Rgb = [225, 225, 225];
const TEXT: Rgb = [40, 40, 40];
const PALETTE: [Rgb; 10] = [
    [31, 119, 180],
    [214, 39, 40],
    [44, 160, 44],
    [255, 127, 14],
    [148, 103, 189],
    [140, 86, 75],
    [227, 119, 194],
    [127, 127, 127],
    [188, 189, 34],
    [23, 190, 207],
];

struct Canvas {
    w: usize,
    h: usize,
    px: Vec<u8>,
}

impl Canvas {
    fn new(w: usize, h: usize) -> Canvas {
        Canvas {
            w,
            h,
            px: vec![255; w * h * 3],
        }
    }

    fn set(&mut self, x: i64, y: i64, c: Rgb) {
        if x < 0 || y < 0 || x >= self.w as i64 || y >= self.h as i64 {
            return;
        }
        let i = (y as usize * self.w + x as usize) * 3;
        self.px[i..i + 3].copy_from_slice(&c);
    }

    fn rect(&mut self, x0: i64, y0: i64, x1: i64, y1: i64, c: Rgb) {
        for y in y0.min(y1)..=y0.max(y1) {
            for x in x0.min(x1)..=x0.max(x1) {
                self.set(x, y, c);
            }
        }
    }

    fn hline(&mut self, x0: i64, x1: i64, y: i64, c: Rgb) {
        self.rect(x0, y, x1, y, c);
    }

    fn vline(&mut self, x: i64, y0: i64, y1: i64, c: Rgb) {
        self.rect(x, y0, x, y1, c);
    }

    /// A line `width` pixels thick (Bresenham, with a square pen), clipped
    /// to `clip` (x0, y0, x1, y1).
    fn line(
        &mut self,
        a: (f64, f64),
        b: (f64, f64),
        width: i64,
        c: Rgb,
        clip: (i64, i64, i64, i64),
    ) {
        let (mut x0, mut y0) = (a.0.round() as i64, a.1.round() as i64);
        let (x1, y1) = (b.0.round() as i64, b.1.round() as i64);
        let dx = (x1 - x0).abs();
        let dy = -(y1 - y0).abs();
        let sx = if x0 < x1 { 1 } else { -1 };
        let sy = if y0 < y1 { 1 } else { -1 };
        let mut err = dx + dy;
        let lo = -(width - 1) / 2;
        let hi = width / 2;
        let mut steps = 0;
        loop {
            for oy in lo..=hi {
                for ox in lo..=hi {
                    let (x, y) = (x0 + ox, y0 + oy);
                    if x >= clip.0 && x <= clip.2 && y >= clip.1 && y <= clip.3 {
                        self.set(x, y, c);
                    }
                }
            }
            if (x0 == x1 && y0 == y1) || steps > 20_000 {
                break;
            }
            steps += 1;
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x0 += sx;
            }
            if e2 <= dx {
                err += dx;
                y0 += sy;
            }
        }
    }

    /// Text with its top-left corner at (x, y), `scale` pixels per font
    /// pixel.
    fn text(&mut self, x: i64, y: i64, s: &str, scale: i64, c: Rgb) {
        let mut cx = x;
        for ch in s.chars() {
            let g = glyph(ch);
            for (row, bits) in g.iter().enumerate() {
                for col in 0..5 {
                    if bits & (0x10 >> col) != 0 {
                        self.rect(
                            cx + col * scale,
                            y + row as i64 * scale,
                            cx + col * scale + scale - 1,
                            y + row as i64 * scale + scale - 1,
                            c,
                        );
                    }
                }
            }
            cx += 6 * scale;
        }
    }

    /// Text turned 90° counter-clockwise (reading upward), its baseline
    /// start at the bottom-left (x, y).
    fn text_up(&mut self, x: i64, y: i64, s: &str, scale: i64, c: Rgb) {
        let mut cy = y;
        for ch in s.chars() {
            let g = glyph(ch);
            for (row, bits) in g.iter().enumerate() {
                for col in 0..5i64 {
                    if bits & (0x10 >> col) != 0 {
                        let px = x + row as i64 * scale;
                        let py = cy - col * scale;
                        self.rect(px, py - scale + 1, px + scale - 1, py, c);
                    }
                }
            }
            cy -= 6 * scale;
        }
    }
}

/// Width in pixels of `s` drawn at `scale`.
fn text_width(s: &str, scale: i64) -> i64 {
    (s.chars().count() as i64 * 6 - 1).max(0) * scale
}

// ---------------------------------------------------------------------------
// Axes
// ---------------------------------------------------------------------------

#[derive(Clone, Copy)]
struct Axis {
    log: bool,
    lo: f64,
    hi: f64,
}

impl Axis {
    fn t(&self, v: f64) -> f64 {
        let (v, lo, hi) = if self.log {
            (v.log10(), self.lo.log10(), self.hi.log10())
        } else {
            (v, self.lo, self.hi)
        };
        (v - lo) / (hi - lo)
    }

    fn usable(&self, v: f64) -> bool {
        v.is_finite() && (!self.log || v > 0.0)
    }
}

fn axis_for(vals: &[f64], log: bool, is_x: bool) -> Axis {
    let v: Vec<f64> = vals
        .iter()
        .copied()
        .filter(|v| v.is_finite() && (!log || *v > 0.0))
        .collect();
    if v.is_empty() {
        return if log {
            Axis {
                log,
                lo: 1.0,
                hi: 10.0,
            }
        } else {
            Axis {
                log,
                lo: 0.0,
                hi: 1.0,
            }
        };
    }
    let mut lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let mut hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if log {
        if is_x {
            lo /= 1.25;
            hi *= 1.25;
        } else {
            lo = 10f64.powf(lo.log10().floor());
            hi = 10f64.powf(hi.log10().ceil());
        }
        if hi <= lo * 1.0001 {
            lo /= 10.0;
            hi *= 10.0;
        }
    } else {
        if !is_x && lo > 0.0 {
            lo = 0.0;
        }
        if hi <= lo {
            hi = lo + 1.0;
        }
        let pad = (hi - lo) * 0.05;
        hi += pad;
        if is_x {
            lo -= pad;
        }
    }
    Axis { log, lo, hi }
}

/// Tick positions and labels.
fn ticks(a: &Axis, sizes: bool) -> Vec<(f64, String)> {
    let mut out = Vec::new();
    if a.log {
        if sizes {
            let (l, h) = (a.lo.log2().ceil() as i32, a.hi.log2().floor() as i32);
            let n = (h - l + 1).max(1);
            let step = ((n + 9) / 10).max(1);
            let mut e = l;
            while e <= h {
                let v = 2f64.powi(e);
                out.push((v, size_label(v)));
                e += step;
            }
        } else {
            let (l, h) = (a.lo.log10().ceil() as i32, a.hi.log10().floor() as i32);
            let step = ((h - l + 1 + 9) / 10).max(1);
            let mut e = l;
            while e <= h {
                let v = 10f64.powi(e);
                out.push((v, num_label(v)));
                e += step;
            }
        }
    } else {
        let span = a.hi - a.lo;
        let raw = span / 6.0;
        let mag = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 5.0, 10.0]
            .iter()
            .map(|m| m * mag)
            .find(|s| span / s <= 8.0)
            .unwrap_or(10.0 * mag);
        let mut v = (a.lo / step).ceil() * step;
        while v <= a.hi + step * 1e-9 {
            out.push((v, num_label(if v.abs() < step * 1e-6 { 0.0 } else { v })));
            v += step;
        }
    }
    out
}

fn size_label(v: f64) -> String {
    let n = v.round() as u64;
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{}Mi", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{}Ki", n >> 10)
    } else {
        n.to_string()
    }
}

fn num_label(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if !(1e-3..1e6).contains(&a) {
        format!("{v:.0e}")
    } else if a >= 1.0 {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        let s = format!("{v:.4}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

// ---------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------

fn render(chart: &Chart<'_>) -> Canvas {
    let mut c = Canvas::new(WIDTH, HEIGHT);
    let (left, right, top, bottom) = (100i64, WIDTH as i64 - 270, 50i64, HEIGHT as i64 - 70);
    let xs: Vec<f64> = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    let ys: Vec<f64> = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .collect();
    let ax = axis_for(&xs, chart.log_x, true);
    let ay = axis_for(&ys, chart.log_y, false);
    let sizes = chart.log_x
        && xs
            .iter()
            .filter(|v| v.is_finite() && **v > 0.0)
            .all(|v| v.fract() == 0.0 && (*v as u64).is_power_of_two());
    let px = |x: f64| left as f64 + ax.t(x) * (right - left) as f64;
    let py = |y: f64| bottom as f64 - ay.t(y) * (bottom - top) as f64;

    // Grid and tick labels.
    for (v, label) in ticks(&ax, sizes) {
        let x = px(v).round() as i64;
        c.vline(x, top, bottom, GRID);
        c.vline(x, bottom, bottom + 5, BLACK);
        c.text(x - text_width(&label, 2) / 2, bottom + 10, &label, 2, TEXT);
    }
    for (v, label) in ticks(&ay, false) {
        let y = py(v).round() as i64;
        c.hline(left, right, y, GRID);
        c.hline(left - 5, left, y, BLACK);
        c.text(left - 10 - text_width(&label, 2), y - 7, &label, 2, TEXT);
    }
    // Frame.
    c.hline(left, right, top, BLACK);
    c.hline(left, right, bottom, BLACK);
    c.vline(left, top, bottom, BLACK);
    c.vline(right, top, bottom, BLACK);
    // Labels.
    let tw = text_width(chart.title, 2);
    c.text(
        ((left + right) / 2 - tw / 2).max(4),
        15,
        chart.title,
        2,
        BLACK,
    );
    let xw = text_width(chart.x_label, 2);
    c.text(
        (left + right) / 2 - xw / 2,
        bottom + 36,
        chart.x_label,
        2,
        TEXT,
    );
    let yw = text_width(chart.y_label, 2);
    c.text_up(12, (top + bottom) / 2 + yw / 2, chart.y_label, 2, TEXT);

    // Series.
    let clip = (left + 1, top + 1, right - 1, bottom - 1);
    let mut drawn = 0;
    for (i, s) in chart.series.iter().enumerate() {
        let col = PALETTE[i % PALETTE.len()];
        let mut prev: Option<(f64, f64)> = None;
        for &(x, y) in &s.points {
            if !(ax.usable(x) && ay.usable(y)) {
                prev = None;
                continue;
            }
            let p = (px(x), py(y));
            if let Some(q) = prev {
                c.line(q, p, 2, col, clip);
            }
            let (mx, my) = (p.0.round() as i64, p.1.round() as i64);
            for yy in my - 3..=my + 3 {
                for xx in mx - 3..=mx + 3 {
                    if xx >= clip.0 && xx <= clip.2 && yy >= clip.1 && yy <= clip.3 {
                        c.set(xx, yy, col);
                    }
                }
            }
            prev = Some(p);
            drawn += 1;
        }
        // Legend entry.
        let ly = top + 10 + i as i64 * 24;
        if ly < bottom {
            c.rect(right + 15, ly + 5, right + 40, ly + 8, col);
            c.rect(right + 25, ly + 3, right + 30, ly + 10, col);
            let name: String = s.name.chars().take(17).collect();
            c.text(right + 48, ly, &name, 2, TEXT);
        }
    }
    if drawn == 0 {
        let msg = "no data";
        c.text(
            (left + right) / 2 - text_width(msg, 3) / 2,
            (top + bottom) / 2 - 10,
            msg,
            3,
            [160, 160, 160],
        );
    }
    c
}

// ---------------------------------------------------------------------------
// Font: 5x7, rows top to bottom, bit 4 = leftmost column
// ---------------------------------------------------------------------------

const FONT: [[u8; 7]; 95] = [
    [0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00], // ' '
    [0x04, 0x04, 0x04, 0x04, 0x04, 0x00, 0x04], // !
    [0x0A, 0x0A, 0x00, 0x00, 0x00, 0x00, 0x00], // "
    [0x0A, 0x1F, 0x0A, 0x0A, 0x1F, 0x0A, 0x00], // #
    [0x04, 0x0F, 0x14, 0x0E, 0x05, 0x1E, 0x04], // $
    [0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03], // %
    [0x0C, 0x12, 0x14, 0x08, 0x15, 0x12, 0x0D], // &
    [0x04, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00], // '
    [0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02], // (
    [0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08], // )
    [0x00, 0x04, 0x15, 0x0E, 0x15, 0x04, 0x00], // *
    [0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00], // +
    [0x00, 0x00, 0x00, 0x00, 0x06, 0x04, 0x08], // ,
    [0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00], // -
    [0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C], // .
    [0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00], // /
    [0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E], // 0
    [0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E], // 1
    [0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F], // 2
    [0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E], // 3
    [0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02], // 4
    [0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E], // 5
    [0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E], // 6
    [0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08], // 7
    [0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E], // 8
    [0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C], // 9
    [0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00], // :
    [0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x04, 0x08], // ;
    [0x02, 0x04, 0x08, 0x10, 0x08, 0x04, 0x02], // <
    [0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00], // =
    [0x08, 0x04, 0x02, 0x01, 0x02, 0x04, 0x08], // >
    [0x0E, 0x11, 0x01, 0x02, 0x04, 0x00, 0x04], // ?
    [0x0E, 0x11, 0x01, 0x0D, 0x15, 0x15, 0x0E], // @
    [0x0E, 0x11, 0x11, 0x11, 0x1F, 0x11, 0x11], // A
    [0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E], // B
    [0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E], // C
    [0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C], // D
    [0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F], // E
    [0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10], // F
    [0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F], // G
    [0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11], // H
    [0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E], // I
    [0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C], // J
    [0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11], // K
    [0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F], // L
    [0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11], // M
    [0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11], // N
    [0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E], // O
    [0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10], // P
    [0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D], // Q
    [0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11], // R
    [0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E], // S
    [0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04], // T
    [0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E], // U
    [0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04], // V
    [0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A], // W
    [0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11], // X
    [0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04], // Y
    [0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F], // Z
    [0x0E, 0x08, 0x08, 0x08, 0x08, 0x08, 0x0E], // [
    [0x00, 0x10, 0x08, 0x04, 0x02, 0x01, 0x00], // backslash
    [0x0E, 0x02, 0x02, 0x02, 0x02, 0x02, 0x0E], // ]
    [0x04, 0x0A, 0x11, 0x00, 0x00, 0x00, 0x00], // ^
    [0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F], // _
    [0x08, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00], // `
    [0x00, 0x00, 0x0E, 0x01, 0x0F, 0x11, 0x0F], // a
    [0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x1E], // b
    [0x00, 0x00, 0x0E, 0x10, 0x10, 0x11, 0x0E], // c
    [0x01, 0x01, 0x0D, 0x13, 0x11, 0x11, 0x0F], // d
    [0x00, 0x00, 0x0E, 0x11, 0x1F, 0x10, 0x0E], // e
    [0x06, 0x09, 0x08, 0x1C, 0x08, 0x08, 0x08], // f
    [0x00, 0x0F, 0x11, 0x11, 0x0F, 0x01, 0x0E], // g
    [0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11], // h
    [0x04, 0x00, 0x0C, 0x04, 0x04, 0x04, 0x0E], // i
    [0x02, 0x00, 0x06, 0x02, 0x02, 0x12, 0x0C], // j
    [0x10, 0x10, 0x12, 0x14, 0x18, 0x14, 0x12], // k
    [0x0C, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E], // l
    [0x00, 0x00, 0x1A, 0x15, 0x15, 0x11, 0x11], // m
    [0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11], // n
    [0x00, 0x00, 0x0E, 0x11, 0x11, 0x11, 0x0E], // o
    [0x00, 0x00, 0x1E, 0x11, 0x1E, 0x10, 0x10], // p
    [0x00, 0x00, 0x0D, 0x13, 0x0F, 0x01, 0x01], // q
    [0x00, 0x00, 0x16, 0x19, 0x10, 0x10, 0x10], // r
    [0x00, 0x00, 0x0E, 0x10, 0x0E, 0x01, 0x1E], // s
    [0x08, 0x08, 0x1C, 0x08, 0x08, 0x09, 0x06], // t
    [0x00, 0x00, 0x11, 0x11, 0x11, 0x13, 0x0D], // u
    [0x00, 0x00, 0x11, 0x11, 0x11, 0x0A, 0x04], // v
    [0x00, 0x00, 0x11, 0x11, 0x15, 0x15, 0x0A], // w
    [0x00, 0x00, 0x11, 0x0A, 0x04, 0x0A, 0x11], // x
    [0x00, 0x00, 0x11, 0x11, 0x0F, 0x01, 0x0E], // y
    [0x00, 0x00, 0x1F, 0x02, 0x04, 0x08, 0x1F], // z
    [0x02, 0x04, 0x04, 0x08, 0x04, 0x04, 0x02], // {
    [0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04], // |
    [0x08, 0x04, 0x04, 0x02, 0x04, 0x04, 0x08], // }
    [0x00, 0x00, 0x08, 0x15, 0x02, 0x00, 0x00], // ~
];

fn glyph(c: char) -> &'static [u8; 7] {
    let c = if c == 'µ' { 'u' } else { c };
    let i = c as u32;
    if (32..127).contains(&i) {
        &FONT[(i - 32) as usize]
    } else {
        &FONT[('?' as u32 - 32) as usize]
    }
}

// ---------------------------------------------------------------------------
// PNG encoder
// ---------------------------------------------------------------------------

fn crc32(data: &[&[u8]]) -> u32 {
    let mut table = [0u32; 256];
    for (n, t) in table.iter_mut().enumerate() {
        let mut c = n as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
        *t = c;
    }
    let mut c = 0xFFFF_FFFFu32;
    for d in data {
        for &b in *d {
            c = table[((c ^ b as u32) & 0xFF) as usize] ^ (c >> 8);
        }
    }
    c ^ 0xFFFF_FFFF
}

fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for chunk in data.chunks(5552) {
        for &x in chunk {
            a += x as u32;
            b += a;
        }
        a %= 65521;
        b %= 65521;
    }
    (b << 16) | a
}

struct Bits {
    out: Vec<u8>,
    acc: u64,
    n: u32,
}

impl Bits {
    /// `n` bits of `v`, least significant first.
    fn put(&mut self, v: u32, n: u32) {
        self.acc |= (v as u64) << self.n;
        self.n += n;
        while self.n >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.n -= 8;
        }
    }

    /// A Huffman code of `n` bits, most significant first.
    fn code(&mut self, code: u32, n: u32) {
        let mut r = 0;
        for i in 0..n {
            r |= ((code >> i) & 1) << (n - 1 - i);
        }
        self.put(r, n);
    }

    fn finish(mut self) -> Vec<u8> {
        if self.n > 0 {
            self.out.push(self.acc as u8);
        }
        self.out
    }
}

fn lit(b: &mut Bits, v: u32) {
    match v {
        0..=143 => b.code(0x30 + v, 8),
        144..=255 => b.code(0x190 + v - 144, 9),
        256..=279 => b.code(v - 256, 7),
        _ => b.code(0xC0 + v - 280, 8),
    }
}

const LEN_BASE: [u32; 29] = [
    3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131,
    163, 195, 227, 258,
];
const LEN_EXTRA: [u32; 29] = [
    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0,
];
const DIST_BASE: [u32; 30] = [
    1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537,
    2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577,
];
const DIST_EXTRA: [u32; 30] = [
    0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13,
    13,
];

fn match_code(b: &mut Bits, len: u32, dist: u32) {
    let i = LEN_BASE.iter().rposition(|&x| x <= len).expect("len >= 3");
    lit(b, 257 + i as u32);
    b.put(len - LEN_BASE[i], LEN_EXTRA[i]);
    let d = DIST_BASE
        .iter()
        .rposition(|&x| x <= dist)
        .expect("dist >= 1");
    b.code(d as u32, 5);
    b.put(dist - DIST_BASE[d], DIST_EXTRA[d]);
}

/// zlib stream of `data`: one fixed-Huffman deflate block whose matches
/// look back one pixel (3 octets) or one row (`stride`).
pub(crate) fn zlib(data: &[u8], stride: usize) -> Vec<u8> {
    let mut b = Bits {
        out: vec![0x78, 0x01],
        acc: 0,
        n: 0,
    };
    b.put(1, 1); // BFINAL
    b.put(1, 2); // fixed Huffman
    let mut i = 0;
    while i < data.len() {
        let mut best = (0usize, 0usize);
        for d in [3usize, stride] {
            if d == 0 || d > i || d > 32768 {
                continue;
            }
            let mut l = 0;
            while l < 258 && i + l < data.len() && data[i + l] == data[i + l - d] {
                l += 1;
            }
            if l > best.0 {
                best = (l, d);
            }
        }
        if best.0 >= 3 {
            match_code(&mut b, best.0 as u32, best.1 as u32);
            i += best.0;
        } else {
            lit(&mut b, data[i] as u32);
            i += 1;
        }
    }
    lit(&mut b, 256);
    let mut out = b.finish();
    out.extend_from_slice(&adler32(data).to_be_bytes());
    out
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    out.extend_from_slice(&crc32(&[kind, data]).to_be_bytes());
}

/// A PNG of `w` × `h` RGB pixels (`rgb` row by row).
pub(crate) fn encode_png(rgb: &[u8], w: usize, h: usize) -> Vec<u8> {
    let stride = 1 + w * 3;
    let mut raw = Vec::with_capacity(stride * h);
    for row in rgb.chunks(w * 3).take(h) {
        raw.push(0); // filter: none
        raw.extend_from_slice(row);
    }
    let mut out = vec![0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A];
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&(w as u32).to_be_bytes());
    ihdr.extend_from_slice(&(h as u32).to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(&mut out, b"IDAT", &zlib(&raw, stride));
    chunk(&mut out, b"IEND", &[]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_checksums() {
        assert_eq!(crc32(&[b"123456789"]), 0xCBF4_3926);
        assert_eq!(adler32(b"Wikipedia"), 0x11E6_0398);
    }

    #[test]
    fn renders_edge_cases_without_panicking() {
        let s = [
            Series {
                name: "a".into(),
                points: vec![
                    (64.0, 3.0),
                    (4096.0, f64::NAN),
                    (65536.0, 0.0),
                    (1048576.0, 900.0),
                ],
            },
            Series {
                name: "empty".into(),
                points: vec![],
            },
        ];
        for (lx, ly) in [(true, true), (false, false), (true, false)] {
            let c = Chart {
                title: "t",
                x_label: "x",
                y_label: "y",
                log_x: lx,
                log_y: ly,
                series: &s,
            };
            let img = render(&c);
            assert_eq!(img.px.len(), WIDTH * HEIGHT * 3);
            assert!(img.px.iter().any(|&b| b != 255));
        }
        let none: [Series; 0] = [];
        let c = Chart {
            title: "nothing",
            x_label: "",
            y_label: "",
            log_x: true,
            log_y: true,
            series: &none,
        };
        let png = encode_png(&render(&c).px, WIDTH, HEIGHT);
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    }
}
