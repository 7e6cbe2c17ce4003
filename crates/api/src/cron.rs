//! The CEL rule every schedule field of the CRDs carries (seed 001): six fields, seconds
//! first, or a macro; five fields are refused.

/// CEL for cron: six blank-separated fields, or a macro (seed 001 refuses five).
pub(crate) const CRON_RULE: &str = "self.matches('^ *([^ @][^ ]*( +[^ ]+){5}|(?i:@(hourly|daily|midnight|weekly|monthly|yearly|annually))) *$')";

/// What [`CRON_RULE`] says when it refuses.
pub(crate) const CRON_MESSAGE: &str = "expected six fields, seconds first (second minute hour day-of-month month day-of-week, e.g. \"0 0 2 * * *\"), or a macro (@hourly, @daily, @weekly, @monthly, @yearly); five fields are refused: \"0 2 * * *\" is written \"0 0 2 * * *\"";
