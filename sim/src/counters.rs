//! Per-queue-pair counters at the host interface: doorbells rung, work requests posted,
//! send completions written and held back. What a NIC's performance counters show, and
//! what a test of doorbell batching or selective signaling counts.
//!
//! ```
//! use zverbs_sim::*;
//! let f = Fabric::with_devices(1);
//! let ctx = f.open_device("sim0").unwrap();
//! let pd = ctx.alloc_pd().unwrap();
//! let cq = ctx.create_cq(8).unwrap();
//! let cap = QpCaps { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
//! let qp = pd.create_qp(&QpInitAttr { send_cq: &cq, recv_cq: &cq, cap, sq_sig_all: false }).unwrap();
//! qp.modify(&Transition::Init(InitAttr { port: 1, pkey_index: 0, access: AccessFlags::empty() })).unwrap();
//! // Two receives in one call: one doorbell.
//! qp.post_recv(&[RecvWr::<1>::new(0), RecvWr::new(1)]).unwrap();
//! let c = qp.counters();
//! assert_eq!((c.recv_doorbells, c.recvs_posted, c.send_doorbells), (1, 2, 0));
//! assert_eq!(f.qp_counters(qp.qp_num()), Some(c));
//! ```

/// What one queue pair did since it was created. Plain counts, kept under the fabric's
/// lock, deterministic like everything else in the simulator.
///
/// Every send work request posted ends in exactly one of `send_completions` and
/// `silent_sends` once it is executed or flushed (a reset or a crash discards the work
/// still queued without either).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QpCounters {
    /// `post_send` calls that posted at least one work request: doorbells rung.
    pub send_doorbells: u64,
    /// Send work requests posted (accepted by a `post_send` call).
    pub sends_posted: u64,
    /// `post_recv` calls that posted at least one work request.
    pub recv_doorbells: u64,
    /// Receive work requests posted.
    pub recvs_posted: u64,
    /// Completions written for send work requests: one per signaled request, and one per
    /// request that failed or was flushed (those complete signaled or not).
    pub send_completions: u64,
    /// Unsignaled send work requests that succeeded without a completion of their own.
    pub silent_sends: u64,
}

impl QpCounters {
    /// `n` more send work requests posted by a post call already counted.
    #[inline]
    pub(crate) fn more_sends(&mut self, n: usize) {
        self.sends_posted += n as u64;
    }

    /// One post call that posted `n` work requests (sends, or receives).
    #[inline]
    pub(crate) fn posts(&mut self, send: bool, n: usize) {
        if n == 0 {
            return;
        }
        let n = n as u64;
        if send {
            self.send_doorbells += 1;
            self.sends_posted += n;
        } else {
            self.recv_doorbells += 1;
            self.recvs_posted += n;
        }
    }

    /// The end of one send work request: with a completion written for it, or silently
    /// (unsignaled and successful).
    #[inline]
    pub(crate) fn send_end(&mut self, completion: bool) {
        if completion {
            self.send_completions += 1;
        } else {
            self.silent_sends += 1;
        }
    }
}
