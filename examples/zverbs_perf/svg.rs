//! The latency histogram as SVG, drawn with plotters.

use hdrhistogram::Histogram;
use plotters::prelude::*;

use crate::report::LatStats;
use crate::Res;

/// Bars across the latency range.
const BINS: usize = 80;

/// A latency histogram (`h`: nanoseconds) as a self-contained SVG. Both axes are
/// logarithmic: bins are equally wide in log(latency) from t_min to t_max (so a long tail
/// stays readable) and the counts are on a log scale (so a few slow samples stay visible
/// next to thousands of fast ones). The median and the 99th and 99.9th percentiles are
/// marked.
pub fn histogram_svg(h: &Histogram<u64>, st: &LatStats, title: &str) -> Res<String> {
    let lo = st.min.max(1e-3);
    let hi = st.max.max(lo * 1.01);
    let (llo, lhi) = (lo.log10(), hi.log10());
    let edge = |i: usize| 10f64.powf(llo + (lhi - llo) * i as f64 / BINS as f64);
    let mut counts = [0u64; BINS];
    for v in h.iter_recorded() {
        let us = (v.value_iterated_to() as f64 / 1000.0).clamp(lo, hi);
        let i = ((us.log10() - llo) / (lhi - llo) * BINS as f64) as usize;
        counts[i.min(BINS - 1)] += v.count_at_value();
    }
    let peak = counts.iter().copied().max().unwrap_or(1).max(1) as f64;
    let top = 10f64.powf(peak.log10().ceil().max(1.0));
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (860, 480)).into_drawing_area();
        root.fill(&WHITE)?;
        let subtitle = format!(
            "t_min {:.2}  t_typical {:.2}  t_avg {:.2}  99% {:.2}  99.9% {:.2}  t_max {:.2} usec",
            st.min, st.median, st.avg, st.p99, st.p999, st.max
        );
        let (head, body) = root.split_vertically(48);
        head.draw_text(title, &("sans-serif", 16).into_text_style(&head), (12, 6))?;
        head.draw_text(
            &subtitle,
            &("sans-serif", 12).into_font().color(&RGBColor(85, 85, 85)),
            (12, 28),
        )?;
        let mut chart = ChartBuilder::on(&body)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d((lo..hi).log_scale(), (0.8..top).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("latency [usec], log scale")
            .x_labels(10)
            .x_label_formatter(&|us| format!("{us:.2}"))
            .y_desc("samples (log scale)")
            .disable_x_mesh()
            .draw()?;
        let bar = RGBColor(0x4f, 0x81, 0xbd).filled();
        chart.draw_series(
            counts
                .iter()
                .enumerate()
                .filter(|(_, &c)| c > 0)
                .map(|(i, &c)| Rectangle::new([(edge(i), 0.8), (edge(i + 1), c as f64)], bar)),
        )?;
        for (v, name, color) in [
            (st.median, "median", RGBColor(0x2e, 0x7d, 0x32)),
            (st.p99, "99%", RGBColor(0xef, 0x6c, 0x00)),
            (st.p999, "99.9%", RGBColor(0xc6, 0x28, 0x28)),
        ] {
            chart
                .draw_series(LineSeries::new([(v, 0.8), (v, top)], color.stroke_width(2)))?
                .label(format!("{name} {v:.2}"))
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
    }
    Ok(svg)
}
