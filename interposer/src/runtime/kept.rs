//! Answers to size questions kept and given again, shared by the modules that keep them
//! (`cudnn_sizes`, `sparselt_sizes`, `cufft_plans`, `solver_sizes`): what the hook decided
//! for a call, the outputs the server's reply wrote, writing them to a later caller (checked
//! against the server's answer where they come from an earlier session), and their bytes in
//! the store of learned answers (`crate::learned`).

use std::hash::{Hash, Hasher};

use chidori_protocol::desc::{CallDesc, Dir, Wire};

use super::Prepared;
use crate::ahead::Answers;
use crate::ahead::learned::Space;

/// The outputs of a size query: (parameter, bytes) each, and the status.
pub(crate) type Answer = (u64, Vec<(usize, Vec<u8>)>);

/// What the hook decided for a call about to be sent.
pub enum Action {
    /// Answered here: the status to return (the outputs are written).
    Answered(u64),
    /// A size query to ask the server: learn its answer under this key.
    Learn(u64),
    Send,
}

/// How a module counts one parameter in a content fingerprint ([`content`]).
pub(crate) enum Part {
    /// By this value.
    Hash(u64),
    /// Not at all (the library's context).
    Leave,
    /// As every module does: a value by itself, a buffer by its length; anything else
    /// refused.
    Usual,
    /// Not a question kept: no fingerprint.
    Refuse,
}

/// The fingerprint of a call's content that kept answers are keyed by: `head` (which
/// call), each parameter but `skip` as `part` says of it and its argument in `args`, then
/// the bytes of the call's inputs (or `inputs` in their place). None where a part refuses.
pub(crate) fn content(
    head: impl Hash,
    desc: &CallDesc,
    args: &[u64],
    prepared: &Prepared,
    skip: Option<usize>,
    inputs: Option<&[u8]>,
    mut part: impl FnMut(&Wire, u64) -> Part,
) -> Option<u64> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    head.hash(&mut h);
    for (i, wire) in desc.params.iter().enumerate() {
        if Some(i) == skip {
            continue;
        }
        let a = args.get(i).copied().unwrap_or(0);
        match part(wire, a) {
            Part::Hash(v) => v.hash(&mut h),
            Part::Leave => {}
            Part::Refuse => return None,
            Part::Usual => match *wire {
                Wire::Val { .. } => a.hash(&mut h),
                Wire::Buf { dir: Dir::In | Dir::Out, .. } | Wire::Null => prepared.call.lens.get(i).hash(&mut h),
                _ => return None,
            },
        }
    }
    match inputs {
        Some(bytes) => bytes.hash(&mut h),
        None => {
            for b in &prepared.bulk {
                b.as_ref().hash(&mut h);
            }
        }
    }
    Some(h.finish())
}

/// What an object says after a call that changes it: what it said before, then the call.
pub(crate) fn combine(before: u64, call: u64) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (before, call).hash(&mut h);
    h.finish()
}

/// How a device address counts in a question: by its alignment, up to 256 bytes (NULL
/// apart). A size query reads no array, and an array's address differs from process to
/// process.
pub(crate) fn alignment(address: u64) -> u64 {
    if address == 0 { u64::from(u32::MAX) } else { u64::from(address.trailing_zeros().min(8)) }
}

/// A size question keyed `key`: answered from `cache` (asked in this process), or from
/// the store of learned answers in `space` (asked in an earlier session on this server:
/// given now, the call still made and its answer checked, `differs` naming how it may
/// differ); else asked, to be learned under `key`.
pub(crate) fn answer(
    desc: &'static CallDesc,
    args: &[u64],
    prepared: &Prepared,
    key: u64,
    cache: &Answers<u64, Answer>,
    space: Space,
    differs: &'static str,
) -> Action {
    if let Some(answer) = cache.get(&key) {
        if !give(&answer, prepared) {
            return Action::Learn(key);
        }
        crate::trace::local(desc.name);
        return Action::Answered(answer.0);
    }
    if let Ok(conn) = crate::conn::get()
        && let Some(answer) = crate::learned::with(&conn, |l| l.get(space, &stored(desc, key)).and_then(decode)).flatten()
        // SAFETY: the caller's arguments, as the descriptor says.
        && let Some(status) = unsafe { give_checked(&conn, desc, args, prepared, answer.clone(), differs) }
    {
        cache.learn(key, answer);
        return Action::Answered(status);
    }
    Action::Learn(key)
}

/// After the server answered a question asked under `key`: keep a success in `cache` and,
/// for later sessions, in the store's `space`.
pub(crate) fn learn(
    key: u64,
    status: u64,
    desc: &CallDesc,
    prepared: &Prepared,
    cache: &Answers<u64, Answer>,
    space: Space,
) {
    if status != desc.codes.success as u64 {
        return;
    }
    let answer = (status, outputs(prepared));
    if let Ok(conn) = crate::conn::get() {
        crate::learned::with(&conn, |l| l.learn(space, &stored(desc, key), &encode(&answer)));
    }
    cache.learn(key, answer);
}

/// The outputs the server's reply just wrote, (parameter, bytes) each.
pub(crate) fn outputs(prepared: &Prepared) -> Vec<(usize, Vec<u8>)> {
    prepared
        .outs
        .iter()
        .map(|o| {
            // SAFETY: the caller's output of `len` bytes, just written by the reply.
            (o.param, unsafe { std::slice::from_raw_parts(o.ptr as *const u8, o.len) }.to_vec())
        })
        .collect()
}

/// A question answered from what was learned, the call still made: it goes without
/// waiting, its outputs into buffers of the client's own, compared with `answer` when its
/// reply comes (`differs` names how, in the error that ends the session otherwise); the
/// caller's outputs get `answer`'s. Its status, or None where the answer does not fit the
/// call or the call could not be sent.
///
/// # Safety
/// `args` are the caller's, as `desc` takes them; `prepared` is their preparation.
pub(crate) unsafe fn give_checked(
    conn: &std::sync::Arc<crate::conn::Conn>,
    desc: &'static CallDesc,
    args: &[u64],
    prepared: &Prepared,
    answer: Answer,
    differs: &'static str,
) -> Option<u64> {
    if !fits(&answer, prepared) {
        return None;
    }
    let mut scratch: Vec<Box<[u8]>> = Vec::new();
    let mut check_args = args.to_vec();
    for o in &prepared.outs {
        let mut b = vec![0u8; o.len].into_boxed_slice();
        if let Some(a) = check_args.get_mut(o.param) {
            *a = b.as_mut_ptr() as u64;
        }
        scratch.push(b);
    }
    // SAFETY: the caller's arguments but its outputs, which are `scratch`'s buffers; the
    // checking thread keeps them until the reply has landed.
    let slot = unsafe { super::send_checked(conn, desc, &check_args) }?;
    give(&answer, prepared);
    let params: Vec<usize> = prepared.outs.iter().map(|o| o.param).collect();
    crate::learned::check(conn.clone(), desc.name, slot, scratch, move |outcome, scratch| {
        let got: Vec<(usize, Vec<u8>)> = params.iter().copied().zip(scratch.iter().map(|b| b.to_vec())).collect();
        match outcome {
            Ok(s) if *s != answer.0 => Some(format!("status {s}, not {}", answer.0)),
            _ if got != answer.1 => Some(differs.to_owned()),
            _ => None,
        }
    });
    crate::trace::local(desc.name);
    Some(answer.0)
}

/// Whether `answer` has the outputs this call asks for (the same parameters and lengths).
fn fits(answer: &Answer, prepared: &Prepared) -> bool {
    answer.1.len() == prepared.outs.len()
        && answer.1.iter().all(|(p, b)| prepared.outs.iter().any(|o| o.param == *p && o.len == b.len()))
}

/// Write `answer`'s outputs to the caller; false where they do not fit this call.
pub(crate) fn give(answer: &Answer, prepared: &Prepared) -> bool {
    if !fits(answer, prepared) {
        return false;
    }
    for (param, bytes) in &answer.1 {
        if let Some(target) = prepared.outs.iter().find(|o| o.param == *param) {
            // SAFETY: the caller's output of `len` bytes (checked equal), as for the server's answer.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), target.ptr as *mut u8, bytes.len()) };
        }
    }
    true
}

/// The key of a question in the store of learned answers: this release and the call's name
/// with its in-process key (a hash only this release computes alike). cuFFT's made plans
/// are kept under such keys too.
pub(crate) fn stored(desc: &CallDesc, key: u64) -> Vec<u8> {
    format!("{}|{}|{key:016x}", env!("CARGO_PKG_VERSION"), desc.name).into_bytes()
}

pub(crate) fn encode((status, outs): &Answer) -> Vec<u8> {
    let mut v = status.to_le_bytes().to_vec();
    for (param, bytes) in outs {
        v.extend_from_slice(&(*param as u32).to_le_bytes());
        v.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        v.extend_from_slice(bytes);
    }
    v
}

pub(crate) fn decode(v: &[u8]) -> Option<Answer> {
    let status = u64::from_le_bytes(v.get(..8)?.try_into().ok()?);
    let mut outs = Vec::new();
    let mut at = 8;
    while at < v.len() {
        let param = u32::from_le_bytes(v.get(at..at + 4)?.try_into().ok()?) as usize;
        let len = u32::from_le_bytes(v.get(at + 4..at + 8)?.try_into().ok()?) as usize;
        outs.push((param, v.get(at + 8..at + 8 + len)?.to_vec()));
        at += 8 + len;
    }
    Some((status, outs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_kept_as_bytes_and_read_back() {
        let answer = (0u64, vec![(1usize, vec![96u8, 0, 0, 0, 0, 0, 0, 0]), (3, vec![])]);
        assert_eq!(decode(&encode(&answer)), Some(answer.clone()));
        let bytes = encode(&answer);
        assert_eq!(decode(&bytes[..bytes.len() - 9]), None, "cut short");
    }
}
