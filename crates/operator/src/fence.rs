//! The store's lease ([`tidemark_engine::fence`]) around every deletion the operator makes:
//! a retention pass, a finalizer's deletion. Two operator leaders in a handover, two
//! policies on one store directory, or the operator beside a standalone `tidemark run` or
//! a person's `tidemark gc` then never delete from one store at once: the second waits
//! (`Waiting`, naming the holder) and is retried; one that loses the lease stops.

use tidemark_engine::fence::{Fence, Wait, holder};
use tidemark_store::ClusterStore;

use crate::context::Context;
use crate::error::Error;

/// Takes `store`'s lease for this operator (`operator/<identity>/<random>`), without
/// waiting.
///
/// # Errors
/// Another holder has it ([`tidemark_engine::EngineError::LeaseHeld`], class contention:
/// retried), or the store failed.
pub async fn acquire(ctx: &Context, store: &ClusterStore) -> Result<Fence, Error> {
    Ok(Fence::acquire(
        store,
        &holder(&format!("operator/{}", ctx.identity)),
        ctx.clock.clone(),
        ctx.store_lease,
        Wait::No,
        |_| {},
    )
    .await?)
}
