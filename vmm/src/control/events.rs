//! Event lines the server sends unasked, shaped like QMP's:
//! `{"event": NAME, "data": {...}, "timestamp": {"seconds": s, "microseconds": us}}`.

use crate::protocol::events::{EventKind, SamplesDropped};
use crate::protocol::{Event, Message};
use crate::sampler::Shared;

/// `SAMPLE` events for the sampler's points after `since`, and the newest
/// sequence number they cover. Points already dropped from the ring are
/// reported as one `SAMPLES_DROPPED` event first.
pub(crate) fn samples_after(samples: &Shared, since: u64) -> (Vec<Vec<u8>>, u64) {
    let (points, dropped) = samples.since(since);
    let mut lines = Vec::with_capacity(points.len() + 1);
    let line = |kind: &EventKind| Message::Event(Event::of(kind)).to_line();
    if dropped > 0 {
        lines.push(line(&EventKind::SamplesDropped(SamplesDropped {
            count: dropped,
        })));
    }
    let last = points.last().map_or(since, |p| p.seq);
    lines.extend(
        points
            .iter()
            .map(|p| line(&EventKind::Sample(p.to_record(&samples.header)))),
    );
    (lines, last)
}
