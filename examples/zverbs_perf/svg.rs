//! The latency histogram, written as a self-contained SVG (no plotting dependency).

use std::fmt::Write as _;

use crate::report::LatStats;

/// A latency histogram as a self-contained SVG. Both axes are logarithmic: bins are
/// equally wide in log(latency) from t_min to t_max (so a long tail stays readable), and
/// the bar heights are log(count) (so a few slow samples stay visible next to thousands of
/// fast ones). The median, the 99th and the 99.9th percentiles are marked.
pub fn histogram_svg(sorted: &[u64], st: &LatStats, title: &str) -> String {
    const W: f64 = 860.0;
    const H: f64 = 480.0;
    const L: f64 = 70.0; // margins
    const R: f64 = 30.0;
    const T: f64 = 56.0;
    const B: f64 = 60.0;
    const BINS: usize = 80;
    let lo = st.min.max(1e-3);
    let hi = st.max.max(lo * 1.01);
    let (llo, lhi) = (lo.log10(), hi.log10());
    let mut counts = [0u64; BINS];
    for &s in sorted {
        let l = (s as f64 / 1000.0).max(lo).log10();
        let i = (((l - llo) / (lhi - llo)) * BINS as f64) as usize;
        counts[i.min(BINS - 1)] += 1;
    }
    let peak = counts.iter().copied().max().unwrap_or(1).max(1) as f64;
    let ytop = peak.log10().ceil().max(1.0); // decades on the count axis
    let (pw, ph) = (W - L - R, H - T - B);
    let x_of = |us: f64| L + (us.max(lo).log10() - llo) / (lhi - llo) * pw;
    let y_of = |c: f64| T + ph - (c + 1.0).log10().min(ytop) / ytop * ph;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="14">{}</text>"#,
        W / 2.0,
        xml_escape(title)
    );
    let _ = writeln!(
        svg,
        r##"<text x="{}" y="40" text-anchor="middle" fill="#555">t_min {:.2}  t_typical {:.2}  t_avg {:.2}  99% {:.2}  99.9% {:.2}  t_max {:.2} usec</text>"##,
        W / 2.0,
        st.min,
        st.median,
        st.avg,
        st.p99,
        st.p999,
        st.max
    );
    let bw = pw / BINS as f64;
    for (i, &c) in counts.iter().enumerate() {
        if c == 0 {
            continue;
        }
        let (from, to) = (
            10f64.powf(llo + (lhi - llo) * i as f64 / BINS as f64),
            10f64.powf(llo + (lhi - llo) * (i + 1) as f64 / BINS as f64),
        );
        let y = y_of(c as f64);
        let _ = writeln!(
            svg,
            r##"<rect x="{:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="#4f81bd"><title>{from:.2}–{to:.2} usec: {c}</title></rect>"##,
            L + i as f64 * bw,
            (bw - 0.5).max(0.5),
            T + ph - y
        );
    }
    // Axes.
    let _ = writeln!(
        svg,
        r#"<path d="M{L} {T} V{y} H{x}" stroke="black" fill="none"/>"#,
        y = T + ph,
        x = L + pw
    );
    // x ticks at 1, 2, 5 × 10^k usec inside the range, plus both ends.
    let mut ticks = vec![lo, hi];
    for k in (llo.floor() as i32)..=(lhi.ceil() as i32) {
        for m in [1.0, 2.0, 5.0] {
            let v = m * 10f64.powi(k);
            let x = x_of(v);
            if v > lo && v < hi && (x - x_of(lo)).abs() > 30.0 && (x_of(hi) - x).abs() > 30.0 {
                ticks.push(v);
            }
        }
    }
    for v in ticks {
        let x = x_of(v);
        let _ = writeln!(
            svg,
            r#"<line x1="{x:.1}" y1="{y}" x2="{x:.1}" y2="{y2}" stroke="black"/><text x="{x:.1}" y="{ty}" text-anchor="middle">{}</text>"#,
            tick_label(v),
            y = T + ph,
            y2 = T + ph + 5.0,
            ty = T + ph + 18.0
        );
    }
    for d in 0..=(ytop as i32) {
        let c = 10f64.powi(d);
        let y = y_of(c - 1.0);
        let _ = writeln!(
            svg,
            r##"<line x1="{x1}" y1="{y:.1}" x2="{x2}" y2="{y:.1}" stroke="#ddd"/><text x="{tx}" y="{ty:.1}" text-anchor="end">{c:.0}</text>"##,
            x1 = L,
            x2 = L + pw,
            tx = L - 6.0,
            ty = y + 4.0
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">latency [usec], log scale</text>"#,
        L + pw / 2.0,
        H - 18.0
    );
    let _ = writeln!(
        svg,
        r#"<text x="18" y="{y}" text-anchor="middle" transform="rotate(-90 18 {y})">samples (log scale)</text>"#,
        y = T + ph / 2.0
    );
    for (row, (v, name, color)) in [
        (st.median, "median", "#2e7d32"),
        (st.p99, "99%", "#ef6c00"),
        (st.p999, "99.9%", "#c62828"),
    ]
    .into_iter()
    .enumerate()
    {
        let x = x_of(v);
        let right = x > L + pw * 0.75;
        let _ = writeln!(
            svg,
            r#"<line x1="{x:.1}" y1="{T}" x2="{x:.1}" y2="{y:.1}" stroke="{color}" stroke-dasharray="4 3"/><text x="{tx:.1}" y="{ty}" fill="{color}" text-anchor="{anchor}">{name} {v:.2}</text>"#,
            y = T + ph,
            tx = if right { x - 4.0 } else { x + 4.0 },
            ty = T + 14.0 + 14.0 * row as f64,
            anchor = if right { "end" } else { "start" }
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// A short axis label: 0.5, 2, 20, 1.2k ...
fn tick_label(v: f64) -> String {
    if v >= 1000.0 {
        format!("{:.3}k", v / 1000.0)
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
            .replace(".k", "k")
    } else if v >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
