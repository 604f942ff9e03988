//! The blocking level: post one work request and wait for its completion.

use super::*;

impl<P: Provider, const DEPTH: usize, const SGES: usize> Channel<P, DEPTH, SGES> {
    /// Sends the concatenation of `data` and waits until the peer's HCA acknowledged it.
    #[inline]
    pub fn send<'a>(
        &mut self,
        data: impl IntoIterator<Item = LocalSlice<'a>>,
    ) -> Result<(), Error<P::Error>> {
        self.blocking_send(
            data.into_iter().map(|s| s.sge()),
            SendOp::Send,
            SendFlags::empty(),
        )
    }

    /// Sends `data` with 32 bits of immediate data for the receiver.
    pub fn send_with_imm<'a>(
        &mut self,
        data: impl IntoIterator<Item = LocalSlice<'a>>,
        imm: u32,
    ) -> Result<(), Error<P::Error>> {
        self.blocking_send(
            data.into_iter().map(|s| s.sge()),
            SendOp::SendWithImm(imm),
            SendFlags::empty(),
        )
    }

    /// Sends `bytes` inline: the HCA copies them at post time, so they need no registration.
    /// At most `QpConfig::caps.max_inline_data` bytes.
    pub fn send_inline(&mut self, bytes: &[u8]) -> Result<(), Error<P::Error>> {
        let length = u32::try_from(bytes.len())
            .map_err(|_| Error::InvalidAttribute("inline data too long"))?;
        let sge = Sge {
            addr: bytes.as_ptr() as u64,
            length,
            lkey: 0,
        };
        self.blocking_send([sge], SendOp::Send, SendFlags::INLINE)
    }

    /// Posts one receive into `data` and waits for a message. Returns its length and
    /// immediate data.
    pub fn receive<'a>(
        &mut self,
        data: impl IntoIterator<Item = LocalSliceMut<'a>>,
    ) -> Result<Completion, Error<P::Error>> {
        let (sg_list, num_sge, _) = self.sges(data.into_iter().map(|s| s.sge()))?;
        let seq = self.post_recv_now(RecvWr {
            wr_id: 0,
            sg_list,
            num_sge,
        })?;
        self.wait_fresh(Queue::Recv, seq, |c| c)
    }

    /// Writes `data` to the start of `remote`.
    #[inline]
    pub fn write<'a>(
        &mut self,
        data: impl IntoIterator<Item = LocalSlice<'a>>,
        remote: &RemoteRegion,
    ) -> Result<(), Error<P::Error>> {
        let op = remote.write_op();
        self.blocking_rdma(data.into_iter().map(|s| s.sge()), remote, op)
    }

    /// Writes `data` to `remote` and hands `imm` to a receive at the peer.
    pub fn write_with_imm<'a>(
        &mut self,
        data: impl IntoIterator<Item = LocalSlice<'a>>,
        remote: &RemoteRegion,
        imm: u32,
    ) -> Result<(), Error<P::Error>> {
        let op = remote.write_with_imm_op(imm);
        self.blocking_rdma(data.into_iter().map(|s| s.sge()), remote, op)
    }

    /// Reads from the start of `remote` into `data`.
    pub fn read<'a>(
        &mut self,
        data: impl IntoIterator<Item = LocalSliceMut<'a>>,
        remote: &RemoteRegion,
    ) -> Result<(), Error<P::Error>> {
        let op = remote.read_op();
        self.blocking_rdma(data.into_iter().map(|s| s.sge()), remote, op)
    }

    /// Adds `add` to the `u64` at the start of `remote`; returns the previous value, which
    /// also lands in `result` (8 bytes).
    pub fn fetch_add(
        &mut self,
        result: LocalSliceMut<'_>,
        remote: &RemoteRegion,
        add: u64,
    ) -> Result<u64, Error<P::Error>> {
        let op = remote.fetch_add_op(add);
        self.blocking_atomic(result, remote, op)
    }

    /// Replaces the `u64` at the start of `remote` with `swap` if it equals `compare`;
    /// returns the previous value, which also lands in `result` (8 bytes).
    pub fn compare_swap(
        &mut self,
        result: LocalSliceMut<'_>,
        remote: &RemoteRegion,
        compare: u64,
        swap: u64,
    ) -> Result<u64, Error<P::Error>> {
        let op = remote.compare_swap_op(compare, swap);
        self.blocking_atomic(result, remote, op)
    }

    fn blocking_atomic(
        &mut self,
        result: LocalSliceMut<'_>,
        remote: &RemoteRegion,
        op: SendOp,
    ) -> Result<u64, Error<P::Error>> {
        if result.len() != 8 {
            return Err(Error::InvalidAttribute(
                "an atomic's result slice must be 8 bytes",
            ));
        }
        self.qp.check_atomics()?;
        self.blocking_rdma([result.sge()], remote, op)?;
        Ok(result.read_u64().unwrap_or_default())
    }

    /// Posts one signaled send work request and waits for it. Only its success is
    /// reported: none of these operations has anything else to say.
    ///
    /// This and [`blocking_send`](Self::blocking_send) inline into the public calls, which
    /// inline into their callers: a post+poll then costs no frame of its own (saved
    /// registers, the request and the result passed through memory).
    #[inline(always)]
    fn blocking_rdma(
        &mut self,
        sges: impl IntoIterator<Item = Sge>,
        remote: &RemoteRegion,
        op: SendOp,
    ) -> Result<(), Error<P::Error>> {
        let seq = self.post_send_seq(sges, op, SendFlags::empty(), Some(remote))?;
        self.wait_fresh(Queue::Send, seq, drop)
    }

    #[inline(always)]
    fn blocking_send(
        &mut self,
        sges: impl IntoIterator<Item = Sge>,
        op: SendOp,
        flags: SendFlags,
    ) -> Result<(), Error<P::Error>> {
        let seq = self.post_send_seq(sges, op, flags, None)?;
        self.wait_fresh(Queue::Send, seq, drop)
    }
}
