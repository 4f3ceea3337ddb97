//! Tables in a library's own host memory that a call hands back by pointer: cuRAND's Sobol'
//! direction vectors and scramble constants (`curandGetDirectionVectors32/64`,
//! `curandGetScrambleConstants32/64`). A pointer into the worker's memory must never reach a
//! client, and would mean nothing there: the spec's `table` wire form gives the call an
//! output buffer of the table's size as its first parameter, the library writes its pointer
//! at the buffer's start, and the worker replaces it with the table's bytes, which the
//! client keeps for the program.
//!
//! The sizes are the header's: 20,000 dimensions of 32 `unsigned int` (32-bit sets) or 64
//! `unsigned long long` (64-bit sets), one scramble constant per dimension.

/// `out` holds at its start the pointer the library wrote: fill all of `out` with the bytes
/// it points at. The bytes are read through the kernel, so a table shorter than `out` is an
/// error, never a fault.
pub fn fill(out: &mut [u8]) -> Result<(), String> {
    let Some(word) = out.first_chunk::<8>() else { return Err("a table's output is shorter than a pointer".into()) };
    let table = u64::from_le_bytes(*word);
    if table == 0 {
        return Err("the library returned no table".into());
    }
    if !chidori_protocol::mirror::read_own(table, out) {
        return Err(format!("the library's table at {table:#x} is shorter than {} bytes", out.len()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pointer_becomes_the_bytes_it_points_at() {
        let table: Vec<u8> = (0..64u8).collect();
        let mut out = vec![0u8; 64];
        out[..8].copy_from_slice(&(table.as_ptr() as u64).to_le_bytes());
        fill(&mut out).unwrap();
        assert_eq!(out, table);
        // A table that ends where memory ends is an error, not a fault.
        let page = 4096;
        // SAFETY: a fresh anonymous page, unmapped again below.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), page, libc::PROT_READ, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        assert_ne!(p, libc::MAP_FAILED);
        let mut long = vec![0u8; 2 * page];
        long[..8].copy_from_slice(&(p as u64).to_le_bytes());
        // The page after the mapping is (almost surely) not mapped; unmap it to be sure.
        // SAFETY: the range just past our mapping; unmapping nothing is no error.
        unsafe { libc::munmap((p as usize + page) as *mut libc::c_void, page) };
        assert!(fill(&mut long).is_err());
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(p, page) };
        let mut null = vec![0u8; 16];
        assert!(fill(&mut null).is_err());
    }
}
