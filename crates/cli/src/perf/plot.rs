//! PNG line charts for the perf reports, drawn with `plotters` (bitmap
//! backend) and text in DejaVu Sans embedded in the binary (no system
//! fonts, no external tools).
//!
//! Contract: [`write_png`] draws every [`Series`] of a [`Chart`] as a line
//! with point markers, axes with tick labels (log scale when asked; sizes
//! in octets as `64`, `4Ki`, `1Mi` on a log x axis of powers of two), the
//! axis labels, a title, and a legend to the right of the plot area (never
//! over the data), and writes an RGB PNG to `path`. Points that cannot be
//! drawn (NaN, infinite, ≤ 0 on a log axis) are skipped and a line is
//! broken there; a chart without any drawable point still gets its axes,
//! title and a "no data" note.
//!
//! Output: [`WIDTH`] × [`HEIGHT`] pixels, white background.

use std::io;
use std::path::Path;
use std::sync::Once;

use plotters::coord::ranged1d::{Ranged, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

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
    /// Label under the x axis (with its unit).
    pub x_label: &'a str,
    /// Label beside the y axis (with its unit).
    pub y_label: &'a str,
    /// Logarithmic x axis (sizes).
    pub log_x: bool,
    /// Logarithmic y axis.
    pub log_y: bool,
    /// The lines.
    pub series: &'a [Series],
}

/// Image width, pixels.
pub const WIDTH: u32 = 1000;
/// Image height, pixels.
pub const HEIGHT: u32 = 600;

/// Width of the legend column right of the plot area, pixels.
const LEGEND_W: u32 = 230;

/// The family name the embedded font is registered under.
const FONT: &str = "sans-serif";

const TEXT: RGBColor = RGBColor(40, 40, 40);
const GRID: RGBColor = RGBColor(225, 225, 225);
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Registers the embedded font with plotters (once per process).
fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The bytes are a valid TrueType font shipped by the `dejavu` crate.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
    });
}

/// Renders `chart` to a PNG file at `path`.
pub fn write_png(chart: &Chart<'_>, path: &Path) -> io::Result<()> {
    register_font();
    render(chart, path).map_err(io::Error::other)
}

/// Renders `chart` through a plotters bitmap backend writing `path`.
fn render(chart: &Chart<'_>, path: &Path) -> Result<(), String> {
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let body = root
        .margin(10, 0, 0, 0)
        .titled(chart.title, (FONT, 24).into_font().color(&BLACK))
        .map_err(|e| e.to_string())?;
    let (plot, legend) = body.split_horizontally(WIDTH - LEGEND_W);

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
    // Log axes tick where [`ticks`] says; linear ones where plotters does.
    let xt: Vec<f64> = ticks(&ax, sizes).into_iter().map(|t| t.0).collect();
    let yt: Vec<f64> = ticks(&ay, false).into_iter().map(|t| t.0).collect();
    let (xr, yr) = (ax.lo..ax.hi, ay.lo..ay.hi);
    let drawn = match (ax.log, ay.log) {
        (true, true) => draw_plot(
            &plot,
            chart,
            (ax, ay, sizes),
            xr.log_scale().with_key_points(xt),
            yr.log_scale().with_key_points(yt),
        ),
        (true, false) => draw_plot(
            &plot,
            chart,
            (ax, ay, sizes),
            xr.log_scale().with_key_points(xt),
            RangedCoordf64::from(yr),
        ),
        (false, true) => draw_plot(
            &plot,
            chart,
            (ax, ay, sizes),
            RangedCoordf64::from(xr),
            yr.log_scale().with_key_points(yt),
        ),
        (false, false) => draw_plot(
            &plot,
            chart,
            (ax, ay, sizes),
            RangedCoordf64::from(xr),
            RangedCoordf64::from(yr),
        ),
    }?;
    if drawn == 0 {
        let (w, h) = plot.dim_in_pixel();
        let style = (FONT, 32)
            .into_font()
            .color(&RGBColor(160, 160, 160))
            .pos(Pos::new(HPos::Center, VPos::Center));
        plot.draw(&Text::new("no data", (w as i32 / 2, h as i32 / 2), style))
            .map_err(|e| e.to_string())?;
    }
    draw_legend(&legend, chart.series)?;
    root.present().map_err(|e| e.to_string())
}

/// The axes, grid and lines of `chart` in `area`; the number of points
/// drawn.
fn draw_plot<X, Y>(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    chart: &Chart<'_>,
    (ax, ay, sizes): (Axis, Axis, bool),
    x: X,
    y: Y,
) -> Result<usize, String>
where
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let mut cc = ChartBuilder::on(area)
        .margin(12)
        .x_label_area_size(64)
        .y_label_area_size(96)
        .build_cartesian_2d(x, y)
        .map_err(|e| e.to_string())?;
    let x_fmt = |v: &f64| {
        if sizes {
            size_label(*v)
        } else {
            num_label(*v)
        }
    };
    let y_fmt = |v: &f64| num_label(*v);
    cc.configure_mesh()
        .x_desc(chart.x_label)
        .y_desc(chart.y_label)
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .label_style((FONT, 16).into_font().color(&TEXT))
        .axis_desc_style((FONT, 18).into_font().color(&TEXT))
        .bold_line_style(GRID)
        .light_line_style(WHITE)
        .axis_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    let mut drawn = 0;
    for (i, s) in chart.series.iter().enumerate() {
        let col = PALETTE[i % PALETTE.len()];
        // Runs of drawable points: a line breaks where a point cannot be
        // drawn.
        let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
        for &(px, py) in &s.points {
            if ax.usable(px) && ay.usable(py) {
                runs.last_mut().expect("one run at least").push((px, py));
            } else if !runs.last().is_some_and(|r| r.is_empty()) {
                runs.push(Vec::new());
            }
        }
        for run in runs.into_iter().filter(|r| !r.is_empty()) {
            drawn += run.len();
            cc.draw_series(LineSeries::new(run.iter().copied(), col.stroke_width(2)))
                .map_err(|e| e.to_string())?;
            cc.draw_series(run.into_iter().map(|p| Circle::new(p, 4, col.filled())))
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(drawn)
}

/// One legend entry per series (line, marker, name), top down, in the
/// column right of the plot area.
fn draw_legend(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    series: &[Series],
) -> Result<(), String> {
    let (_, h) = area.dim_in_pixel();
    let style = (FONT, 16)
        .into_font()
        .color(&TEXT)
        .pos(Pos::new(HPos::Left, VPos::Center));
    for (i, s) in series.iter().enumerate() {
        let y = 30 + i as i32 * 26;
        if y > h as i32 - 10 {
            break;
        }
        let col = PALETTE[i % PALETTE.len()];
        let name: String = s.name.chars().take(22).collect();
        area.draw(&PathElement::new(
            vec![(8, y), (40, y)],
            col.stroke_width(2),
        ))
        .and_then(|_| area.draw(&Circle::new((24, y), 4, col.filled())))
        .and_then(|_| area.draw(&Text::new(name, (48, y), style.clone())))
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Axes
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
struct Axis {
    log: bool,
    lo: f64,
    hi: f64,
}

impl Axis {
    fn usable(&self, v: f64) -> bool {
        v.is_finite() && (!self.log || v > 0.0) && v >= self.lo && v <= self.hi
    }
}

/// The range of an axis over `vals`: a log x axis gets a quarter of a
/// factor of slack each side, a log y axis whole decades, a linear axis
/// 5 % above (and below for x; a linear y axis starts at 0).
fn axis_for(vals: &[f64], log: bool, is_x: bool) -> Axis {
    let v: Vec<f64> = vals
        .iter()
        .copied()
        .filter(|v| v.is_finite() && (!log || *v > 0.0))
        .collect();
    if v.is_empty() {
        let (lo, hi) = if log { (1.0, 10.0) } else { (0.0, 1.0) };
        return Axis { log, lo, hi };
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

/// Tick positions and labels: powers of two (sizes) or of ten on a log
/// axis, at most about ten; steps of 1, 2 or 5 × 10^n on a linear one.
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
            let v0 = if v.abs() < step * 1e-6 { 0.0 } else { v };
            out.push((v0, num_label(v0)));
            v += step;
        }
    }
    out
}

/// A size in octets as the tables show it (`64`, `4Ki`, `1Mi`).
fn size_label(v: f64) -> String {
    super::report::fmt_size(v.round() as u64)
}

/// A tick value, short: no trailing zeros, exponent form far from 1.
fn num_label(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if !(1e-3..1e7).contains(&a) {
        format!("{v:.0e}")
    } else if a >= 1.0 {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        let s = format!("{v:.4}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_and_labels() {
        let a = axis_for(&[64.0, 1048576.0], true, true);
        let t: Vec<String> = ticks(&a, true).into_iter().map(|t| t.1).collect();
        assert_eq!(t.first().map(String::as_str), Some("64"));
        assert!(t.contains(&"1Mi".to_string()), "{t:?}");
        assert!(t.len() <= 11, "{t:?}");
        let a = axis_for(&[3.2, 870.0], true, false);
        assert_eq!((a.lo, a.hi), (1.0, 1000.0));
        let t: Vec<String> = ticks(&a, false).into_iter().map(|t| t.1).collect();
        assert_eq!(t, ["1", "10", "100", "1000"]);
        assert_eq!(num_label(0.25), "0.25");
        assert_eq!(num_label(2e7), "2e7");
    }

    #[test]
    fn renders_edge_cases_to_png_files() {
        let dir = std::env::temp_dir().join(format!("softrdma-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
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
        for (i, (lx, ly)) in [(true, true), (false, false), (true, false)]
            .into_iter()
            .enumerate()
        {
            let c = Chart {
                title: "t",
                x_label: "x",
                y_label: "y",
                log_x: lx,
                log_y: ly,
                series: &s,
            };
            let p = dir.join(format!("edge{i}.png"));
            write_png(&c, &p).unwrap();
            let d = std::fs::read(&p).unwrap();
            assert_eq!(&d[..8], b"\x89PNG\r\n\x1a\n");
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
        write_png(&c, &dir.join("none.png")).unwrap();
        // A chart as `perf loss` draws it: linear axes.
        let loss = [Series {
            name: "UD Write-Record".into(),
            points: vec![(0.0, 9.5), (1.0, 9.1), (5.0, 7.9)],
        }];
        let c = Chart {
            title: "Goodput vs loss, 64 KiB messages",
            x_label: "loss (%)",
            y_label: "goodput (Gbit/s)",
            log_x: false,
            log_y: false,
            series: &loss,
        };
        write_png(&c, &dir.join("loss.png")).unwrap();
        if std::env::var_os("SOFTRDMA_PLOT_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}
