//! The workspace's counting allocator ([`zverbs_testkit`]), installed for every binary of
//! this crate (fuzz targets and tests), so that a target can assert "allocates nothing" or
//! "never more than `MAX_PAYLOAD`", whatever its input claims. Outside [`measure`] it only
//! forwards to the system allocator (and keeps process-wide totals).

pub use zverbs_testkit::{measure, AllocStats};

#[global_allocator]
static GLOBAL: zverbs_testkit::CountingAlloc = zverbs_testkit::CountingAlloc;
