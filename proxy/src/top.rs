//! `sidecache top`: a terminal view of a running sidecache, refreshed every
//! `--interval` seconds: hit ratio, requests per second by path, the
//! write-behind queue, upstream masters' health and the hot keys by reads.
//!
//! It reads the metrics endpoint (`--metrics`, the sidecache's
//! `--metrics-listen`): `/metrics` has every figure, including per-master
//! health that INFO does not split, and `/debug/hotkeys` the hot keys, so
//! it needs nothing the endpoint does not already serve (and no password:
//! the endpoint has none). Rates are the counters' deltas between two
//! scrapes.
//!
//! # Layout
//! - [`scrape`]: blocking HTTP GETs, the Prometheus text format, the hot-key
//!   JSON;
//! - [`view`]: two samples → the figures (pure);
//! - [`render`]: the figures → ratatui widgets (pure, tested on a
//!   `TestBackend`);
//! - here: the loop (scrape, draw, wait for a key or the next tick) and the
//!   terminal's set-up and restoration (also on panic, by ratatui's hook).
//!
//! A sidecache that goes away is shown as disconnected, with the last
//! figures, and asked again every interval.

pub mod render;
pub mod scrape;
pub mod view;

use std::time::{Duration, Instant};

use anyhow::Context as _;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};

use crate::config::TopArgs;
use view::View;

/// Runs the view until `q`, Esc or Ctrl-C; the terminal is restored on
/// every way out.
///
/// # Errors
/// The terminal cannot be set up, drawn on or read from (a scrape failure
/// is shown, not returned).
pub fn run(args: &TopArgs) -> anyhow::Result<()> {
    use std::io::IsTerminal as _;
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        anyhow::bail!("needs a terminal (stdin and stdout); for figures in a script read /metrics");
    }
    let mut terminal = match ratatui::try_init() {
        Ok(t) => t,
        Err(e) => {
            ratatui::restore();
            return Err(anyhow::Error::new(e).context("cannot set up the terminal"));
        }
    };
    let result = watch(&mut terminal, args);
    ratatui::restore();
    result
}

fn watch(terminal: &mut ratatui::DefaultTerminal, args: &TopArgs) -> anyhow::Result<()> {
    let interval = Duration::from_secs_f64(args.interval);
    // Long enough for a busy process, short enough that a hung one does
    // not keep `q` waiting long.
    let timeout = interval.clamp(Duration::from_millis(250), Duration::from_secs(2));
    let mut view = View::connecting(&args.metrics, args.interval);
    let mut prev = None;
    terminal.draw(|f| render::render(f, &view))?;
    loop {
        let tick = Instant::now();
        match scrape::sample(&args.metrics, args.n, timeout) {
            Ok(sample) => {
                view.update(prev.as_ref(), &sample);
                prev = Some(sample);
            }
            Err(e) => {
                view.failed(format!("{e:#}"));
                prev = None;
            }
        }
        terminal
            .draw(|f| render::render(f, &view))
            .context("drawing")?;
        let next = tick + interval;
        loop {
            let left = next.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            if !event::poll(left).context("reading the terminal")? {
                break;
            }
            match event::read().context("reading the terminal")? {
                Event::Key(k) if k.kind != KeyEventKind::Release && quits(k.code, k.modifiers) => {
                    return Ok(())
                }
                Event::Resize(..) => {
                    terminal
                        .draw(|f| render::render(f, &view))
                        .context("drawing")?;
                }
                _ => {}
            }
        }
    }
}

/// `q`, Esc, Ctrl-C (in raw mode Ctrl-C is a key, not a signal).
fn quits(code: KeyCode, mods: KeyModifiers) -> bool {
    matches!(code, KeyCode::Char('q') | KeyCode::Esc)
        || (code == KeyCode::Char('c') && mods.contains(KeyModifiers::CONTROL))
}

#[cfg(test)]
mod tests;
