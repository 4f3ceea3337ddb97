//! The GPU's process lists under Chidori (NVML's `nvmlDevice*RunningProcesses*` and
//! `nvmlDeviceGetProcessUtilization`, the spec's `processes` wire form). The library lists
//! every process on the server's GPU, other users' among them; a session is shown its own:
//! the entries of this worker process (which holds the session's CUDA context), under the
//! program's PID on the client's machine. `torch.cuda.list_gpu_processes()`, gpustat and
//! nvitop then show the program with the GPU memory it uses, as they would locally.
//!
//! Each entry is a record whose first field is the 4-byte `pid` (every list above). The
//! array travels both ways (`inout[*count]`): entries past those kept get the caller's bytes
//! back, as natively the library leaves them, so nothing of another process reaches the
//! client. Where the array is too short (NVML_ERROR_INSUFFICIENT_SIZE) the array goes back
//! as the caller sent it and the count the library asks for, every process counted, goes
//! back unchanged.

use chidori_protocol::desc::{CallDesc, Len, Wire, word_at};

/// Where a call of the `processes` form keeps its list: the array's parameter, its count's,
/// and the bytes of one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct List {
    pub array: usize,
    pub count: usize,
    pub entry: usize,
}

/// The list of `desc`: its one array sized by a count behind a pointer (`inout[*count]`),
/// whose entries are records that start with the 4-byte PID.
pub fn list(desc: &CallDesc) -> Option<List> {
    desc.params.iter().enumerate().find_map(|(array, wire)| match *wire {
        Wire::Buf { elem, len: Some(&Len::Deref(count)), record: Some(record), .. } if pid_first(desc, record) => {
            Some(List { array, count: usize::from(count), entry: elem as usize })
        }
        _ => None,
    })
}

/// Whether `record` (as the newest headers of `desc` lay it out) starts with a 4-byte `pid`.
fn pid_first(desc: &CallDesc, record: &str) -> bool {
    desc.versions
        .last()
        .and_then(|v| chidori_cuda::structs::get(v, record))
        .is_some_and(|layout| layout.fields.iter().any(|f| f.name == "pid" && f.offset == 0 && f.size == 4))
}

/// After the library filled `entries` and wrote how many into `count` (4 bytes): keep the
/// entries of process `own` at the front, each under `program`, give the rest the bytes the
/// caller sent (`sent`), and write the number kept into `count`. Where that cannot be done
/// (no count, entries that do not hold a PID), nothing is listed.
pub fn keep_own(entries: &mut [u8], sent: &[u8], count: &mut [u8], entry: usize, own: u32, program: u32) {
    let listed = word_at(count, 4);
    let (Some(listed), true) = (listed, entry >= 4 && sent.len() == entries.len()) else {
        forget_all(entries, sent, count);
        return;
    };
    let listed = (listed as usize).min(entries.len() / entry);
    let mut kept = 0;
    for i in 0..listed {
        let at = i * entry;
        if word_at(&entries[at..], 4) != Some(u64::from(own)) {
            continue;
        }
        entries.copy_within(at..at + entry, kept * entry);
        entries[kept * entry..kept * entry + 4].copy_from_slice(&program.to_le_bytes());
        kept += 1;
    }
    entries[kept * entry..].copy_from_slice(&sent[kept * entry..]);
    count[..4].copy_from_slice(&(kept as u32).to_le_bytes());
}

/// Give `entries` back the caller's bytes (`sent`, or zeros where they do not fit) and list
/// none: after a failed call (NVML need not leave the array as it was when it answers
/// NVML_ERROR_INSUFFICIENT_SIZE), or an answer that cannot be cut.
pub fn forget_all(entries: &mut [u8], sent: &[u8], count: &mut [u8]) {
    if sent.len() == entries.len() {
        entries.copy_from_slice(sent);
    } else {
        entries.fill(0);
    }
    if let Some(c) = count.first_chunk_mut::<4>() {
        *c = 0u32.to_le_bytes();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Entries of 16 bytes: the PID, 4 bytes of padding, 8 of memory used.
    fn entries(list: &[(u32, u64)], slots: usize) -> Vec<u8> {
        let mut out = vec![0xeeu8; slots * 16];
        for (i, (pid, used)) in list.iter().enumerate() {
            out[i * 16..i * 16 + 4].copy_from_slice(&pid.to_le_bytes());
            out[i * 16 + 8..i * 16 + 16].copy_from_slice(&used.to_le_bytes());
        }
        out
    }

    #[test]
    fn only_the_own_process_is_kept_under_the_programs_pid() {
        let sent = vec![0x55u8; 4 * 16];
        let mut got = entries(&[(100, 7), (42, 1 << 20), (300, 9)], 4);
        let mut count = 3u32.to_le_bytes();
        keep_own(&mut got, &sent, &mut count, 16, 42, 9999);
        assert_eq!(u32::from_le_bytes(count), 1);
        let mut want = entries(&[(9999, 1 << 20)], 1);
        want.extend_from_slice(&sent[16..]);
        assert_eq!(&got[..16], &want[..16]);
        assert_eq!(got, want, "no byte of another process stays");
    }

    #[test]
    fn no_own_process_lists_none() {
        let sent = vec![1u8; 2 * 16];
        let mut got = entries(&[(100, 7), (300, 9)], 2);
        let mut count = 2u32.to_le_bytes();
        keep_own(&mut got, &sent, &mut count, 16, 42, 9999);
        assert_eq!(u32::from_le_bytes(count), 0);
        assert_eq!(got, sent);
    }

    #[test]
    fn an_answer_that_cannot_be_cut_lists_nothing() {
        let sent = [3u8; 32];
        let mut got = entries(&[(100, 7), (42, 1)], 2);
        let mut count = 2u32.to_le_bytes();
        keep_own(&mut got, &sent[..16], &mut count, 16, 42, 9);
        assert_eq!((got, u32::from_le_bytes(count)), (vec![0u8; 32], 0));
    }

    #[test]
    fn a_count_past_the_array_reads_no_further() {
        let sent = vec![0u8; 16];
        let mut got = entries(&[(42, 5)], 1);
        let mut count = 50u32.to_le_bytes();
        keep_own(&mut got, &sent, &mut count, 16, 42, 7);
        assert_eq!(u32::from_le_bytes(count), 1);
        assert_eq!(&got[..4], &7u32.to_le_bytes());
    }
}
