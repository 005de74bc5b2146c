//! The report as one self-contained HTML file: the carriers' timeline as inline SVG (zoom with
//! the wheel or the buttons, drag to pan, double-click to reset: a few lines of inline script,
//! nothing fetched, so it opens offline), then the wait profile and the fibers' longest waits.

use std::fmt::Write as _;

use crate::analyze::{Report, Stats};

/// Width of the timeline in SVG units; the script zooms by changing the view box.
const W: f64 = 1600.0;
const ROW: f64 = 26.0;
/// Slices narrower than this share of the span are drawn merged with their neighbours.
const DETAIL: f64 = 1.0 / 6000.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn us(t: f64) -> String {
    if t >= 1e6 {
        format!("{:.3} s", t / 1e6)
    } else if t >= 1e3 {
        format!("{:.3} ms", t / 1e3)
    } else {
        format!("{t:.1} µs")
    }
}

fn hue(key: &str) -> u32 {
    key.bytes().fold(2166136261u32, |h, b| (h ^ u32::from(b)).wrapping_mul(16777619)) % 360
}

pub fn render(r: &Report, title: &str, max_fibers: usize) -> String {
    let span = (r.end - r.start).max(1.0);
    let x = |t: f64| (t - r.start) / span * W;
    let mut svg = String::new();
    let height = ROW * r.tracks.len().max(1) as f64;
    let _ = write!(
        svg,
        r#"<svg id="tl" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {height}" preserveAspectRatio="none" width="100%" height="{height}">"#
    );
    for (row, t) in r.tracks.iter().enumerate() {
        let y = row as f64 * ROW;
        let _ = write!(
            svg,
            r##"<rect x="0" y="{y}" width="{W}" height="{ROW}" fill="{}"/>"##,
            if row % 2 == 0 { "#fafafa" } else { "#f0f0f0" }
        );
        // Idle periods closer than the detail limit are drawn as one.
        let mut idle = t.idle.iter().copied().peekable();
        while let Some((ts, dur)) = idle.next() {
            let mut end = ts + dur;
            let mut n = 1;
            while let Some(&(next, d)) = idle.peek().filter(|(next, _)| next - end < span * DETAIL) {
                end = end.max(next + d);
                n += 1;
                idle.next();
            }
            let what = if n == 1 {
                format!("idle {}", us(dur))
            } else {
                format!("{n} idle periods over {}", us(end - ts))
            };
            let _ = write!(
                svg,
                r##"<rect class="idle" x="{:.3}" y="{:.1}" width="{:.3}" height="{:.1}" fill="#d8d8d8"><title>{what}</title></rect>"##,
                x(ts),
                y + ROW * 0.35,
                ((end - ts) / span * W).max(0.02),
                ROW * 0.3,
            );
        }
        // Runs of slices too narrow to see one by one are drawn as one rectangle.
        let min = span * DETAIL;
        let mut k = 0;
        while k < t.slices.len() {
            let s = &t.slices[k];
            let mut end = s.ts + s.dur;
            let mut j = k + 1;
            if s.dur < min {
                while j < t.slices.len() && t.slices[j].dur < min && t.slices[j].ts - end < min {
                    end = end.max(t.slices[j].ts + t.slices[j].dur);
                    j += 1;
                }
            }
            let key = s.site.as_deref().unwrap_or(&s.name);
            let tip = if j - k == 1 {
                let then = match (&s.then[..], &s.wait) {
                    ("park", Some(w)) => format!("then parked on {w}"),
                    (t, _) => format!("then {t}"),
                };
                format!(
                    "{} (fiber {}) ran {} at {}, {then}{}",
                    s.name,
                    s.fiber,
                    us(s.dur),
                    us(s.ts - r.start),
                    s.site.as_ref().map(|x| format!("; spawned at {x}")).unwrap_or_default()
                )
            } else {
                format!(
                    "{} slices from {} to {} ({} first)",
                    j - k,
                    us(s.ts - r.start),
                    us(end - r.start),
                    s.name
                )
            };
            let _ = write!(
                svg,
                r#"<rect class="run" x="{:.3}" y="{:.1}" width="{:.3}" height="{:.1}" fill="hsl({},60%,{}%)"><title>{}</title></rect>"#,
                x(s.ts),
                y + 3.0,
                ((end - s.ts) / span * W).max(0.05),
                ROW - 6.0,
                hue(key),
                if j - k == 1 { 55 } else { 40 },
                esc(&tip)
            );
            k = j;
        }
        for (ts, what) in &t.marks {
            let _ = write!(
                svg,
                r##"<rect class="mark" x="{:.3}" y="{y}" width="0.6" height="{ROW}" fill="#c00"><title>{} at {}</title></rect>"##,
                x(*ts),
                esc(what),
                us(ts - r.start)
            );
        }
    }
    svg.push_str("</svg>");

    let mut labels = String::new();
    for t in &r.tracks {
        let _ = write!(labels, r#"<div class="lab" style="height:{ROW}px">{}</div>"#, esc(&t.name));
    }

    let tot = &r.totals;
    let mut body = String::new();
    let _ = write!(
        body,
        "<h1>{}</h1><p class=\"sum\">{} of trace &middot; {} carriers/tracks &middot; fibers spawned <b id=\"spawned\">{}</b> &middot; run slices {} &middot; switches (resumes) <b id=\"switches\">{}</b> &middot; compensating carriers <b id=\"compensations\">{}</b> &middot; blocked carriers seen {} &middot; panics {} &middot; events {} &middot; dropped <b>{}</b></p>",
        esc(title),
        us(span),
        r.tracks.len(),
        tot.fibers_spawned,
        tot.run_slices,
        tot.switches,
        tot.compensations,
        tot.blocked,
        tot.panics,
        tot.events,
        tot.dropped
    );
    let _ = write!(
        body,
        r#"<div class="bar"><button onclick="zoom(0.5)">zoom in</button><button onclick="zoom(2)">zoom out</button><button onclick="reset()">reset</button> <span class="hint">wheel: zoom &middot; drag: pan &middot; double-click: reset &middot; hover: details</span></div>
<div class="tl"><div class="labs">{labels}</div><div class="plot">{svg}<div id="axis"></div></div></div>"#
    );
    let table = |title: &str, rows: &[(String, Stats)], head: &str| {
        let mut t = format!(
            "<h2>{title}</h2><table><tr><th>{head}</th><th>waits</th><th>total parked</th><th>p50</th><th>p99</th><th>max</th></tr>"
        );
        for (k, s) in rows {
            let _ = write!(
                t,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(k),
                s.count,
                us(s.total),
                us(s.p50),
                us(s.p99),
                us(s.max)
            );
        }
        t.push_str("</table>");
        t
    };
    body.push_str(&table("Wait profile by wait reason", &r.by_reason, "wait reason"));
    body.push_str(&table("Wait profile by spawn site", &r.by_site, "spawn site"));
    let _ = write!(
        body,
        "<h2>Fibers with the longest waits</h2><table><tr><th>fiber</th><th>name</th><th>spawn site</th><th>slices</th><th>ran</th><th>parked</th><th>longest waits</th></tr>"
    );
    for f in r.fibers.iter().filter(|f| !f.longest.is_empty()).take(max_fibers) {
        let longest: Vec<String> =
            f.longest.iter().map(|(d, why)| format!("{} on {}", us(*d), esc(why))).collect();
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            f.id,
            esc(&f.name),
            esc(&f.site),
            f.slices,
            us(f.run),
            us(f.parked),
            longest.join(", ")
        );
    }
    body.push_str("</table>");
    format!(
        r#"<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title><style>
body{{font:13px/1.4 system-ui,sans-serif;margin:16px;color:rgb(34,34,34)}}
h1{{font-size:18px;margin:0 0 4px}} h2{{font-size:15px;margin:18px 0 6px}}
.tl{{display:flex;border:1px solid #ccc}} .labs{{flex:0 0 150px;background:#fff;border-right:1px solid #ccc}}
.lab{{padding-left:6px;display:flex;align-items:center;white-space:nowrap;overflow:hidden}}
.plot{{flex:1;overflow:hidden;cursor:grab}} #axis{{position:relative;height:18px;border-top:1px solid #ccc;font-size:11px}}
#axis span{{position:absolute;transform:translateX(-50%);color:rgb(85,85,85)}}
table{{border-collapse:collapse}} td,th{{border:1px solid #ddd;padding:2px 8px;text-align:left}} th{{background:#f4f4f4}}
.bar{{margin:8px 0}} .hint{{color:rgb(119,119,119)}} .sum b{{color:black}}
</style></head><body>{body}
<script>
const svg=document.getElementById('tl'),axis=document.getElementById('axis');
const W={W},H=svg.viewBox.baseVal.height,SPAN={span};
let vx=0,vw=W;
function fmt(t){{return t>=1e6?(t/1e6).toFixed(3)+' s':t>=1e3?(t/1e3).toFixed(3)+' ms':t.toFixed(1)+' µs';}}
function draw(){{svg.setAttribute('viewBox',vx+' 0 '+vw+' '+H);let h='';for(let i=0;i<=10;i++){{const u=vx+vw*i/10;h+='<span style="left:'+(i*10)+'%">'+fmt(u/W*SPAN)+'</span>';}}axis.innerHTML=h;}}
function zoom(f,at){{const c=at===undefined?vx+vw/2:at;const nw=Math.min(W,Math.max(W*1e-6,vw*f));vx=Math.min(W-nw,Math.max(0,c-(c-vx)*nw/vw));vw=nw;draw();}}
function reset(){{vx=0;vw=W;draw();}}
svg.addEventListener('wheel',e=>{{e.preventDefault();const r=svg.getBoundingClientRect();zoom(e.deltaY<0?0.8:1.25,vx+(e.clientX-r.left)/r.width*vw);}},{{passive:false}});
let drag=null;svg.addEventListener('mousedown',e=>{{drag={{x:e.clientX,vx}};}});
window.addEventListener('mouseup',()=>{{drag=null;}});
window.addEventListener('mousemove',e=>{{if(!drag)return;const r=svg.getBoundingClientRect();vx=Math.min(W-vw,Math.max(0,drag.vx-(e.clientX-drag.x)/r.width*vw));draw();}});
svg.addEventListener('dblclick',reset);
draw();
document.body.dataset.ready='1';
</script></body></html>
"#,
        title = esc(title)
    )
}
