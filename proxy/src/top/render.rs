//! Draws a [`View`] on a ratatui frame: a pure function of the view and
//! the frame's size, so it is tested on a `TestBackend` buffer.
//!
//! ```text
//! ┌ sidecache top ──────────────────────────────────────────────────────┐
//! │ endpoint · version · upstream · ready · clients                     │
//! │ live, every 1s (q, Esc or Ctrl-C quits) | DISCONNECTED: why         │
//! │ hit ratio: last window · since start (hits, misses)                 │
//! └─────────────────────────────────────────────────────────────────────┘
//! ┌ requests/s ────────────────────┐┌ write-behind queue ───────────────┐
//! └────────────────────────────────┘└───────────────────────────────────┘
//! ┌ upstream masters ───────────────────────────────────────────────────┐
//! ┌ hot keys by reads ──────────────────────────────────────────────────┐
//! ```

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Row, Table};
use ratatui::Frame;

use super::view::{Figures, Status, View};

/// Draws `view` over the whole frame.
pub fn render(frame: &mut Frame, view: &View) {
    let nodes = view.figures.as_ref().map_or(1, |f| f.nodes.len().max(1)) as u16;
    let [head, middle, masters, hot] = Layout::vertical([
        Constraint::Length(5),
        Constraint::Length(10),
        // Header row, one row a master, borders; at most half the rest.
        Constraint::Max(nodes.saturating_add(3)),
        Constraint::Min(3),
    ])
    .areas(frame.area());
    frame.render_widget(header(view), head);
    let Some(f) = &view.figures else {
        return;
    };
    let [rates, queue] =
        Layout::horizontal([Constraint::Percentage(55), Constraint::Percentage(45)]).areas(middle);
    render_rates(frame, f, rates);
    frame.render_widget(queue_panel(f), queue);
    render_masters(frame, f, masters);
    render_hotkeys(frame, f, hot);
}

fn header(view: &View) -> Paragraph<'static> {
    let mut lines = Vec::with_capacity(3);
    let dim = Style::default().add_modifier(Modifier::DIM);
    match &view.figures {
        Some(f) => lines.push(Line::from(vec![
            Span::styled(
                view.endpoint.clone(),
                Style::default().add_modifier(Modifier::BOLD),
            ),
            Span::raw(format!(
                " · sidecache {} · upstream {} · ",
                f.version, f.upstream
            )),
            if f.ready {
                Span::styled("ready", Style::default().fg(Color::Green))
            } else {
                Span::styled("NOT READY", Style::default().fg(Color::Red))
            },
            Span::raw(format!(" · {} clients", f.clients)),
        ])),
        None => lines.push(Line::from(Span::styled(
            view.endpoint.clone(),
            Style::default().add_modifier(Modifier::BOLD),
        ))),
    }
    let every = secs(view.interval);
    lines.push(match &view.status {
        Status::Connecting => Line::styled(format!("connecting… (every {every})"), dim),
        Status::Live => Line::styled(format!("live, every {every} (q, Esc or Ctrl-C quits)"), dim),
        Status::Disconnected { error, failures } => Line::styled(
            format!(
                "DISCONNECTED ({failures} failed, retrying every {every}{}): {error}",
                if view.figures.is_some() {
                    "; figures from the last scrape"
                } else {
                    ""
                }
            ),
            Style::default().fg(Color::Red).add_modifier(Modifier::BOLD),
        ),
    });
    if let Some(f) = &view.figures {
        let window = f.window.map_or_else(|| "—".to_owned(), secs);
        lines.push(Line::from(vec![
            Span::styled("hit ratio ", Style::default().add_modifier(Modifier::BOLD)),
            Span::raw(format!(
                "{} last {window} · {} since start (hits {}, misses {})",
                pct(f.hit_ratio_now, 1),
                pct(f.hit_ratio, 2),
                f.hits,
                f.misses
            )),
            // Hits served while a master was out of reach
            // (--l1-stale-if-error), since start.
            Span::styled(
                if f.stale_served > 0 {
                    format!(" · {} stale hits", f.stale_served)
                } else {
                    String::new()
                },
                Style::default()
                    .fg(Color::Yellow)
                    .add_modifier(Modifier::BOLD),
            ),
        ]));
    }
    Paragraph::new(lines).block(Block::bordered().title(" sidecache top "))
}

fn render_rates(frame: &mut Frame, f: &Figures, area: Rect) {
    let rows = f.rates.iter().map(|r| {
        Row::new(vec![
            r.label.to_owned(),
            r.per_sec.map_or_else(|| "—".to_owned(), rate),
            r.from.to_owned(),
        ])
    });
    let title = match f.window {
        Some(w) => format!(" requests/s (last {}) ", secs(w)),
        None => " requests/s ".to_owned(),
    };
    let table = Table::new(
        rows,
        [
            Constraint::Length(12),
            Constraint::Length(10),
            Constraint::Fill(1),
        ],
    )
    .block(Block::bordered().title(title));
    frame.render_widget(table, area);
}

fn queue_panel(f: &Figures) -> Paragraph<'static> {
    let q = &f.queue;
    let warn = |bad: bool| {
        if bad {
            Style::default().fg(Color::Red)
        } else {
            Style::default()
        }
    };
    let lines = vec![
        Line::raw(format!("depth     {} / {}", q.depth, q.max)),
        Line::raw(format!(
            "bytes     {} / {}",
            bytes(q.bytes),
            bytes(q.max_bytes)
        )),
        Line::raw(format!(
            "flush     {} mean",
            q.flush_mean
                .map_or_else(|| "—".to_owned(), |s| format!("{:.1} ms", s * 1e3))
        )),
        Line::styled(format!("failed    {}", q.failed), warn(q.failed > 0)),
        Line::styled(format!("refused   {}", q.refused), warn(q.refused > 0)),
    ];
    Paragraph::new(lines).block(Block::bordered().title(" write-behind queue "))
}

fn render_masters(frame: &mut Frame, f: &Figures, area: Rect) {
    let flag = |v: Option<bool>, yes: &'static str, no: &'static str| match v {
        Some(true) => (yes, Style::default().fg(Color::Green)),
        Some(false) => (no, Style::default().fg(Color::Red)),
        None => ("—", Style::default()),
    };
    let rows = f.nodes.iter().map(|n| {
        let (h, hs) = flag(n.healthy, "ok", "UNHEALTHY");
        let (t, ts) = flag(n.tracking, "up", "DOWN");
        Row::new(vec![
            Line::raw(n.addr.clone()),
            Line::styled(h, hs),
            Line::styled(t, ts),
            Line::raw(n.commands_per_sec.map_or_else(|| "—".to_owned(), rate)),
            Line::raw(n.failures.to_string()),
        ])
    });
    let table = Table::new(
        rows,
        [
            Constraint::Fill(1),
            Constraint::Length(10),
            Constraint::Length(9),
            Constraint::Length(10),
            Constraint::Length(9),
        ],
    )
    .header(
        Row::new(["master", "health", "tracking", "cmds/s", "failures"])
            .style(Style::default().add_modifier(Modifier::BOLD)),
    )
    .block(Block::bordered().title(" upstream masters "));
    frame.render_widget(table, area);
}

fn render_hotkeys(frame: &mut Frame, f: &Figures, area: Rect) {
    let block = Block::bordered().title(match &f.hotkeys {
        Ok(h) => format!(
            " hot keys by reads (estimated: 1 read in {} counted) ",
            h.sample
        ),
        Err(_) => " hot keys ".to_owned(),
    });
    let h = match &f.hotkeys {
        Ok(h) if !h.keys.is_empty() => h,
        Ok(_) => {
            frame.render_widget(Paragraph::new("no key counted yet").block(block), area);
            return;
        }
        Err(why) => {
            frame.render_widget(Paragraph::new(why.clone()).block(block), area);
            return;
        }
    };
    let rows = h.keys.iter().enumerate().map(|(i, k)| {
        Row::new(vec![
            format!("{:>4}", i + 1),
            format!("{:>12}", k.count),
            format!("{:>3}", k.db),
            k.key.clone(),
        ])
    });
    let table = Table::new(
        rows,
        [
            Constraint::Length(4),
            Constraint::Length(12),
            Constraint::Length(3),
            Constraint::Fill(1),
        ],
    )
    .header(
        Row::new(["rank", "       reads", " db", "key"])
            .style(Style::default().add_modifier(Modifier::BOLD)),
    )
    .block(block);
    frame.render_widget(table, area);
}

/// `0.5s`, `1s`, `2.5s`.
fn secs(s: f64) -> String {
    let r = (s * 10.0).round() / 10.0;
    if r.fract() == 0.0 {
        format!("{r:.0}s")
    } else {
        format!("{r:.1}s")
    }
}

/// `97.3%` with `digits` decimals, or `—`.
fn pct(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "—".to_owned(), |v| format!("{:.*}%", digits, v * 100.0))
}

/// A per-second rate: `0.5`, `12.0`, `1234`, `12.3k`, `4.56M`.
fn rate(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// `512 B`, `1.5 KiB`, `256.0 MiB`.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
pub(super) mod format_tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(secs(1.0), "1s");
        assert_eq!(secs(0.5), "0.5s");
        assert_eq!(secs(1.04), "1s");
        assert_eq!(pct(Some(0.97312), 1), "97.3%");
        assert_eq!(pct(Some(0.97312), 2), "97.31%");
        assert_eq!(pct(None, 1), "—");
        assert_eq!(rate(0.5), "0.5");
        assert_eq!(rate(1234.4), "1234");
        assert_eq!(rate(12_345.0), "12.3k");
        assert_eq!(rate(4_560_000.0), "4.56M");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(256 << 20), "256.0 MiB");
    }
}
