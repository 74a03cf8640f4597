//! The adaptive controller's two calls: `lua/adapt.lua` reports this proxy's latencies and
//! claims the room's step when it is due; `lua/adapt_commit.lua` stores what the step computed
//! (`crate::rules::control_step`), unless a later step was claimed meanwhile.

use std::time::Duration;

use super::{RoomStore, StoreError};
use crate::rules::{ControlState, Latencies};
use crate::store::script::needed;

/// How often the room's adaptive controller steps.
pub const ADAPT_PERIOD: Duration = Duration::from_secs(1);
/// A room whose controller nobody has called for this long forgets its batch and starts again
/// at `batch_size`, as a new room does.
const ADAPT_KEEP: Duration = Duration::from_secs(60);

script! {
    static SCRIPT = [] "lua/adapt.lua";
    keys [adaptive, latencies]
    args AdaptArgs {
        period_us: u64,
        keep_ms: u64,
        judged: u64,
        over: u64,
    }
    reply AdaptReply {
        claimed: bool,
        wait_us: i64,
        step: Option<String>,
        batch: Option<i64>,
        settle: Option<i64>,
        served_at_cut: Option<i64>,
        probe_wait: Option<i64>,
        latencies: Option<Vec<i64>>,
        judged: Option<i64>,
        over: Option<i64>,
    }
}

pub(super) mod commit {
    use super::{ControlState, RoomStore, StoreError};

    script! {
        static SCRIPT = [] "lua/adapt_commit.lua";
        keys [adaptive]
        args CommitArgs<'a> {
            step: &'a str,
            batch: u32,
            settle: u32,
            served_at_cut: u32,
            probe_wait: u32,
        }
    }

    impl RoomStore {
        /// Stores the state a claimed step computed; false when a later step was claimed meanwhile.
        pub async fn adapt_commit(&self, step_id: &str, state: ControlState) -> Result<bool, StoreError> {
            let args = CommitArgs {
                step: step_id,
                batch: state.batch,
                settle: state.settle,
                served_at_cut: state.served_at_cut.unwrap_or(0),
                probe_wait: state.probe_wait,
            };
            let stored: i64 = self.run(&invoke(&self.keys, args)).await?;
            Ok(stored == 1)
        }
    }
}

/// A controller step this proxy claimed: compute the next state, then [`RoomStore::adapt_commit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdaptStep {
    /// Identifies the step for the commit.
    pub id: String,
    /// The stored state; `None` before the room's first commit.
    pub state: Option<ControlState>,
    /// Every latency reported since the previous step.
    pub latencies: Latencies,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdaptOutcome {
    /// `Some` when this call claimed the room's step.
    pub step: Option<AdaptStep>,
    /// How long until the room's next step is due.
    pub next_due: Duration,
}

impl RoomStore {
    /// This proxy's once-a-second adaptive call: reports its latencies and claims the room's
    /// controller step when it is due.
    pub async fn adapt(&self, report: &Latencies) -> Result<AdaptOutcome, StoreError> {
        let period_us = ADAPT_PERIOD.as_micros() as u64;
        let args = AdaptArgs {
            period_us,
            keep_ms: ADAPT_KEEP.as_millis() as u64,
            judged: report.judged,
            over: report.over_target,
        };
        let mut call = invoke(&self.keys, args);
        for (bucket, count) in &report.buckets {
            call.arg(*bucket).arg(*count);
        }
        adapted(AdaptReply::decode(self.run(&call).await?)?)
    }
}

/// A claimed step has every field; one not claimed, claimed and wait_us only.
fn adapted(reply: AdaptReply) -> Result<AdaptOutcome, StoreError> {
    let next_due = Duration::from_micros(reply.wait_us.max(0) as u64);
    if !reply.claimed {
        return Ok(AdaptOutcome { step: None, next_due });
    }
    let pairs = reply.latencies.unwrap_or_default();
    let latencies = Latencies {
        buckets: pairs.chunks_exact(2).map(|pair| (pair[0].max(0) as usize, pair[1].max(0) as u64)).collect(),
        judged: reply.judged.unwrap_or(0).max(0) as u64,
        over_target: reply.over.unwrap_or(0).max(0) as u64,
    };
    let number = |name, value: Option<i64>| -> Result<u32, StoreError> {
        Ok(needed(FILE, name, value)?.clamp(0, u32::MAX as i64) as u32)
    };
    let state = match needed(FILE, "batch", reply.batch)? {
        batch if batch >= 0 => Some(ControlState {
            batch: batch.min(u32::MAX as i64) as u32,
            settle: number("settle", reply.settle)?,
            served_at_cut: Some(number("served_at_cut", reply.served_at_cut)?).filter(|n| *n > 0),
            probe_wait: number("probe_wait", reply.probe_wait)?,
        }),
        _ => None,
    };
    let step = AdaptStep { id: needed(FILE, "step", reply.step)?, state, latencies };
    Ok(AdaptOutcome { step: Some(step), next_due })
}
