//! PNG line charts for the perf reports (no system fonts, no external tools).
//!
//! Contract: [`write_png`] draws every [`Series`] of a [`Chart`] as a line
//! with point markers, axes with tick labels (log scale when asked), a title
//! and a legend, and writes an RGB PNG to `path`.

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

/// Renders `chart` to a PNG file at `path`.
pub fn write_png(chart: &Chart<'_>, path: &Path) -> io::Result<()> {
    let _ = (chart, path);
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "plotting is not implemented yet",
    ))
}
