//! Events, each saying what happened. kube-runtime's recorder folds every event of an
//! object with the same type, action and reason into one series for minutes, keeping the
//! first note: the second hook's outcome, or a second deleting pass, vanished under the
//! first one's words. Here only events that say the same thing (the note included) are
//! folded into a series; any other is an event of its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};

/// How long a repeat of an event joins its series (as kube-runtime and client-go do).
const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);
/// The most events remembered for folding: the oldest are forgotten first.
const REMEMBERED: usize = 4096;

/// What makes two events the same.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    regarding: (
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    ),
    warning: bool,
    reason: String,
    action: String,
    note: Option<String>,
}

#[derive(Debug, Clone)]
struct Seen {
    name: String,
    count: i32,
    last: Timestamp,
}

/// Publishes events; see the module. Clones share what they remember.
#[derive(Clone)]
pub struct Recorder {
    client: Client,
    reporter: Reporter,
    seen: Arc<Mutex<HashMap<Key, Seen>>>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("reporter", &self.reporter)
            .finish_non_exhaustive()
    }
}

impl Recorder {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Recorder {
            client,
            reporter,
            seen: Arc::default(),
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Seen>> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Publishes `ev` about `reference`: a new event, unless the same event (same object,
    /// type, reason, action and note) was published within the last minutes — then that
    /// event's series counts one more.
    ///
    /// # Errors
    /// The API refused the event.
    pub async fn publish(
        &self,
        ev: &Event,
        reference: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let key = Key {
            regarding: (
                reference.kind.clone(),
                reference.namespace.clone(),
                reference.name.clone(),
                reference.uid.clone(),
            ),
            warning: matches!(ev.type_, EventType::Warning),
            reason: ev.reason.clone(),
            action: ev.action.clone(),
            note: ev.note.clone(),
        };
        let namespace = reference
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        let repeat = {
            let mut seen = self.seen();
            seen.retain(|_, s| s.last + SERIES_WINDOW > now);
            seen.get(&key).cloned()
        };
        if let Some(s) = repeat {
            let count = s.count + 1;
            let patch = serde_json::json!({
                "series": EventSeries { count, last_observed_time: MicroTime(now) },
            });
            match events
                .patch(&s.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.seen().insert(
                        key,
                        Seen {
                            count,
                            last: now,
                            ..s
                        },
                    );
                    return Ok(());
                }
                // Gone meanwhile (the API server's event TTL): a new one.
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let name = format!(
            "{}.{:x}",
            reference
                .name
                .as_deref()
                .unwrap_or(&self.reporter.controller),
            now.as_nanosecond()
        );
        let event = K8sEvent {
            action: Some(ev.action.clone()),
            reason: Some(ev.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(reference.clone()),
            note: ev.note.clone(),
            metadata: ObjectMeta {
                namespace: Some(namespace.clone()),
                name: Some(name.clone()),
                ..Default::default()
            },
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            type_: Some(
                match ev.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .into(),
            ),
            related: ev.secondary.clone(),
            ..Default::default()
        };
        events.create(&PostParams::default(), &event).await?;
        let mut seen = self.seen();
        if seen.len() >= REMEMBERED
            && let Some(oldest) = seen
                .iter()
                .min_by_key(|(_, s)| s.last)
                .map(|(k, _)| k.clone())
        {
            seen.remove(&oldest);
        }
        seen.insert(
            key,
            Seen {
                name,
                count: 1,
                last: now,
            },
        );
        Ok(())
    }
}

/// The API server refuses an event whose note is longer than 1 KiB (bytes).
pub const NOTE_LIMIT: usize = 1024;

/// `text` cut to at most `limit` bytes on a character boundary, ending in `…` when cut.
pub fn fit(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_owned();
    }
    let end = text.floor_char_boundary(limit.saturating_sub('…'.len_utf8()));
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_fit_the_api_limit() {
        assert_eq!(fit("short", NOTE_LIMIT), "short");
        let long = "é".repeat(2000);
        let cut = fit(&long, NOTE_LIMIT);
        assert!(
            cut.len() <= NOTE_LIMIT && cut.ends_with('…'),
            "{}",
            cut.len()
        );
        assert!(cut.len() >= NOTE_LIMIT - 4);
        let exact = "a".repeat(NOTE_LIMIT);
        assert_eq!(fit(&exact, NOTE_LIMIT), exact);
    }
}
