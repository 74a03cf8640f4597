//! SVG charts with plotters (SVG backend only): grouped bars per path, and lines over time.

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::Result;

/// Series colours in order: seaborn's "deep" palette.
const PALETTE: [u32; 6] = [0x4c72b0, 0xdd8452, 0x55a868, 0xc44e52, 0x8172b3, 0x937860];

fn color(series: usize) -> RGBColor {
    let rgb = PALETTE[series % PALETTE.len()];
    RGBColor((rgb >> 16) as u8, (rgb >> 8) as u8, rgb as u8)
}

fn err<E: std::fmt::Debug>(e: E) -> String {
    format!("chart: {e:?}")
}

/// Grouped bars: one group per category, one bar per series.
pub fn bars(
    path: &std::path::Path,
    title: &str,
    y_desc: &str,
    categories: &[String],
    series: &[(String, Vec<f64>)],
) -> Result<()> {
    let root = SVGBackend::new(path, (960, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let ymax = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.15;
    let n = categories.len().max(1);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..n as f64, 0f64..ymax)
        .map_err(err)?;
    let cats = categories.to_vec();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n * 2 + 1)
        .x_label_formatter(&move |x| {
            let i = x.floor() as usize;
            if (x - i as f64 - 0.5).abs() < 0.01 {
                cats.get(i).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc(y_desc)
        .y_label_formatter(&|y| tick(*y))
        .draw()
        .map_err(err)?;
    let k = series.len().max(1) as f64;
    let width = 0.8 / k;
    for (si, (name, values)) in series.iter().enumerate() {
        let color = color(si);
        let rects = values.iter().enumerate().filter(|(_, v)| v.is_finite()).map(move |(ci, v)| {
            let x0 = ci as f64 + 0.1 + si as f64 * width;
            Rectangle::new([(x0, 0.0), (x0 + width * 0.95, *v)], color.filled())
        });
        chart
            .draw_series(rects)
            .map_err(err)?
            .label(name.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

/// Lines; `log_x` puts x on a log scale (x must be > 0 then).
pub fn lines(
    path: &std::path::Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[(String, Vec<(f64, f64)>)],
    log_x: bool,
) -> Result<()> {
    let root = SVGBackend::new(path, (960, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let pts = series.iter().flat_map(|(_, v)| v.iter().copied()).filter(|(x, y)| x.is_finite() && y.is_finite());
    let (mut xmin, mut xmax, mut ymax) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
    for (x, y) in pts {
        xmin = xmin.min(x);
        xmax = xmax.max(x);
        ymax = ymax.max(y);
    }
    if !xmin.is_finite() {
        xmin = if log_x { 1.0 } else { 0.0 };
        xmax = xmin + 1.0;
    }
    if xmax <= xmin {
        xmax = xmin + 1.0;
    }
    let ymax = ymax.max(1e-9) * 1.1;
    let axes = Axes { title, x_desc, y_desc, ymax };
    // A log scale is another coordinate type, hence one generic drawing for both. Its x values
    // are sizes (1k, 1M) with markers on the few measured points; the legend moves left, where
    // lines rising to the right leave room.
    if log_x {
        let x = (xmin * 0.8..xmax * 1.25).log_scale();
        draw_lines(&root, x, &axes, &|x| human(*x), series, SeriesLabelPosition::UpperLeft, true)?;
    } else {
        draw_lines(&root, xmin..xmax, &axes, &|x| tick(*x), series, SeriesLabelPosition::UpperRight, false)?;
    }
    root.present().map_err(err)
}

struct Axes<'a> {
    title: &'a str,
    x_desc: &'a str,
    y_desc: &'a str,
    ymax: f64,
}

fn draw_lines<X>(
    root: &DrawingArea<SVGBackend, Shift>,
    x: X,
    axes: &Axes,
    x_label: &dyn Fn(&f64) -> String,
    series: &[(String, Vec<(f64, f64)>)],
    legend: SeriesLabelPosition,
    markers: bool,
) -> Result<()>
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(root)
        .caption(axes.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x, 0f64..axes.ymax)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(axes.x_desc)
        .y_desc(axes.y_desc)
        .x_label_formatter(x_label)
        .y_label_formatter(&|y| tick(*y))
        .draw()
        .map_err(err)?;
    for (si, (name, v)) in series.iter().enumerate() {
        let color = color(si);
        chart
            .draw_series(LineSeries::new(v.iter().copied(), color.stroke_width(2)))
            .map_err(err)?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2)));
        if markers {
            chart
                .draw_series(v.iter().map(|&(x, y)| Circle::new((x, y), 4, color.filled())))
                .map_err(err)?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .position(legend)
        .draw()
        .map_err(err)
}

/// An axis label: no ".0" on whole numbers.
fn tick(v: f64) -> String {
    if v.abs() >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        trim(v)
    }
}

pub fn human(x: f64) -> String {
    if x >= 1e6 {
        format!("{}M", trim(x / 1e6))
    } else if x >= 1e3 {
        format!("{}k", trim(x / 1e3))
    } else {
        trim(x)
    }
}

fn trim(x: f64) -> String {
    let s = format!("{x:.1}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}
