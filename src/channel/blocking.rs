//! The blocking level: post one operation and wait for its completion. [`execute`]
//! posts any [`Op`]; the named methods are sugar over it.
//!
//! [`execute`]: Channel::execute

use super::op::{Local, Op};
use super::*;

impl<P: Provider, T: ChannelTransport, const DEPTH: usize, const SGES: usize>
    Channel<P, DEPTH, SGES, T>
{
    /// Posts `op` and waits until it completed (for a send or write: until the peer's HCA
    /// acknowledged it). Only its success is reported: an atomic's previous value is in
    /// its result slice ([`fetch_add`](Self::fetch_add) reads it for you).
    ///
    /// This inlines into the sugar below, which inlines into its callers: a post+poll then
    /// costs no frame of its own (saved registers, the request and the result passed
    /// through memory).
    #[inline(always)]
    pub fn execute<L: Iterator<Item: Local>>(
        &mut self,
        op: Op<'_, L, T::Ops>,
    ) -> Result<(), Error<P::Error>> {
        let seq = self.post_send_seq(op)?;
        self.wait_fresh(Queue::Send, seq, drop)
    }
}

impl<P: Provider, T: HasOwnRx<P, DEPTH, SGES>, const DEPTH: usize, const SGES: usize>
    Channel<P, DEPTH, SGES, T>
{
    /// Posts one receive into `data` and waits for a message. Returns its length and
    /// immediate data. On a datagram channel the first 40 bytes of `data` receive the
    /// global route header, and the length counts them.
    pub fn receive<'a>(
        &mut self,
        data: impl IntoIterator<Item = LocalSliceMut<'a>>,
    ) -> Result<Completion, Error<P::Error>> {
        let seq = self.post_recv_seq(data.into_iter().map(|s| s.sge()))?;
        self.wait_fresh(Queue::Recv, seq, |c| c)
    }
}

impl<P: Provider, T: ChannelTransport<Ops = Rc>, const DEPTH: usize, const SGES: usize>
    Channel<P, DEPTH, SGES, T>
{
    /// Sends the concatenation of `data` and waits until the peer's HCA acknowledged it.
    #[inline]
    pub fn send<'a>(
        &mut self,
        data: impl IntoIterator<Item = LocalSlice<'a>>,
    ) -> Result<(), Error<P::Error>> {
        self.execute(Op::send(data))
    }

    /// Sends `data` with 32 bits of immediate data for the receiver.
    pub fn send_with_imm<'a>(
        &mut self,
        data: impl IntoIterator<Item = LocalSlice<'a>>,
        imm: u32,
    ) -> Result<(), Error<P::Error>> {
        self.execute(Op::send_with_imm(data, imm))
    }

    /// Sends `bytes` inline: the HCA copies them at post time, so they need no registration.
    /// At most `QpConfig::caps.max_inline_data` bytes.
    pub fn send_inline(&mut self, bytes: &[u8]) -> Result<(), Error<P::Error>> {
        self.execute(Op::send_inline(bytes))
    }

    /// Writes `data` to the start of `remote`.
    #[inline]
    pub fn write<'a>(
        &mut self,
        data: impl IntoIterator<Item = LocalSlice<'a>>,
        remote: &RemoteRegion,
    ) -> Result<(), Error<P::Error>> {
        self.execute(Op::write(data, remote))
    }

    /// Writes `data` to `remote` and hands `imm` to a receive at the peer.
    pub fn write_with_imm<'a>(
        &mut self,
        data: impl IntoIterator<Item = LocalSlice<'a>>,
        remote: &RemoteRegion,
        imm: u32,
    ) -> Result<(), Error<P::Error>> {
        self.execute(Op::write_with_imm(data, remote, imm))
    }

    /// Reads from the start of `remote` into `data`.
    pub fn read<'a>(
        &mut self,
        data: impl IntoIterator<Item = LocalSliceMut<'a>>,
        remote: &RemoteRegion,
    ) -> Result<(), Error<P::Error>> {
        self.execute(Op::read(data, remote))
    }

    /// Adds `add` to the `u64` at the start of `remote`; returns the previous value, which
    /// also lands in `result` (8 bytes).
    pub fn fetch_add(
        &mut self,
        mut result: LocalSliceMut<'_>,
        remote: &RemoteRegion,
        add: u64,
    ) -> Result<u64, Error<P::Error>> {
        host_result(&result)?;
        self.execute(Op::fetch_add(result.reborrow(), remote, add))?;
        Ok(result.read_u64().unwrap_or_default())
    }

    /// Replaces the `u64` at the start of `remote` with `swap` if it equals `compare`;
    /// returns the previous value, which also lands in `result` (8 bytes).
    pub fn compare_swap(
        &mut self,
        mut result: LocalSliceMut<'_>,
        remote: &RemoteRegion,
        compare: u64,
        swap: u64,
    ) -> Result<u64, Error<P::Error>> {
        host_result(&result)?;
        self.execute(Op::compare_swap(result.reborrow(), remote, compare, swap))?;
        Ok(result.read_u64().unwrap_or_default())
    }
}

/// An atomic's result must land where the host can read it back.
fn host_result<E>(result: &LocalSliceMut<'_>) -> Result<(), Error<E>> {
    match result.is_host() {
        true => Ok(()),
        false => Err(Error::InvalidAttribute(
            "an atomic's result in device memory cannot be read by the host: post \
             Op::fetch_add or Op::compare_swap, and copy the result out of the device",
        )),
    }
}
