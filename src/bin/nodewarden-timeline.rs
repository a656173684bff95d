//! `nodewarden-timeline`: draws a rollout from Jaeger's traces as one HTML
//! page (the `nodewarden-timeline` crate), a row per replaced node with its
//! phases, the leader changes, replacements in progress.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use nodewarden_timeline as timeline;

#[derive(Parser)]
#[command(
    name = "nodewarden-timeline",
    version,
    about = "Draw a rollout from Jaeger's traces as one HTML page: a row per replaced node with its phases, the leader changes, replacements in progress"
)]
struct Args {
    /// Jaeger's query API (where its UI would be), e.g. http://127.0.0.1:16686.
    #[arg(long)]
    jaeger: String,
    /// The service name nodewarden's spans carry (OTEL_SERVICE_NAME).
    #[arg(long, default_value = "nodewarden")]
    service: String,
    /// How far back to look for traces, e.g. 30m, 2h, 1d.
    #[arg(long, default_value = "2h", value_parser = parse_lookback)]
    lookback: Duration,
    /// The rollout to draw (its trace id); default: the latest one.
    #[arg(long)]
    rollout: Option<String>,
    /// Draw the maxSurge line at this many nodes (default: as the rollout span recorded it).
    #[arg(long)]
    max_surge: Option<u32>,
    /// Where to write the page.
    #[arg(long, default_value = "rollout-timeline.html")]
    out: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(draw(args))
}

fn parse_lookback(s: &str) -> Result<Duration, String> {
    let span: jiff::Span = s
        .parse()
        .map_err(|e| format!("not a duration such as 30m, 2h or 1d: {e}"))?;
    // A lookback is no calendar arithmetic: a day is 24 hours.
    let d = span
        .to_duration(jiff::SpanRelativeTo::days_are_24_hours())
        .map_err(|e| format!("{s}: {e}"))?;
    Duration::try_from(d).map_err(|_| "must not be negative".to_string())
}

/// Fetches the `replace node` and `rollout` traces of the lookback window
/// and writes the page.
async fn draw(args: Args) -> anyhow::Result<()> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .context("the clock is before 1970")?;
    let end = u64::try_from(now.as_micros()).context("the clock is too far ahead")?;
    let start = end.saturating_sub(u64::try_from(args.lookback.as_micros()).unwrap_or(u64::MAX));
    let traces = timeline::fetch_traces(&args.jaeger, &args.service, start, end).await?;
    let drawn = timeline::build(
        &traces,
        &timeline::Options {
            rollout: args.rollout,
            max_surge: args.max_surge,
        },
    );
    std::fs::write(&args.out, timeline::render(&drawn))
        .with_context(|| format!("writing {}", args.out.display()))?;
    println!(
        "{}: {} replaced node{}, {} leader change{}{}",
        args.out.display(),
        drawn.rows.len(),
        if drawn.rows.len() == 1 { "" } else { "s" },
        drawn.leader_changes.len(),
        if drawn.leader_changes.len() == 1 { "" } else { "s" },
        drawn
            .rollout_id
            .as_ref()
            .map(|id| format!(" (rollout trace {id})"))
            .unwrap_or_default()
    );
    if !drawn.other_rollouts.is_empty() {
        println!(
            "other rollouts in the window (--rollout ID): {}",
            drawn.other_rollouts.join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// The timeline reads the spans by the names the operator gives them.
    #[test]
    fn span_names_agree_with_the_operator() {
        use nodewarden::telemetry::trace;
        assert_eq!(nodewarden_timeline::REPLACE_NODE, trace::REPLACE_NODE);
        assert_eq!(nodewarden_timeline::ROLLOUT, trace::ROLLOUT);
        assert_eq!(nodewarden_timeline::ROLLOUT_WAVE, trace::ROLLOUT_WAVE);
        assert_eq!(nodewarden_timeline::WAVE_SOAK, trace::WAVE_SOAK);
        assert_eq!(nodewarden_timeline::ROLLOUT_DOMAIN, trace::ROLLOUT_DOMAIN);
        assert_eq!(nodewarden_timeline::ROLLOUT_HALTED, trace::ROLLOUT_HALTED);
    }
}
