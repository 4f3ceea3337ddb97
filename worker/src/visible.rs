//! Which of the server's GPUs a session sees: the program's `CUDA_VISIBLE_DEVICES`, sent in
//! its Hello, selects among the GPUs the server exposes (its own `CUDA_VISIBLE_DEVICES`,
//! which `--gpu` sets), in the program's order, as CUDA would on the GPU's machine.
//!
//! CUDA's rules, kept: entries are comma-separated indices or UUIDs (`GPU-…`, a prefix is
//! enough); the list ends at the first entry that names no device or one already named; an
//! empty list shows no GPU. The real backend applies the result as its process's
//! `CUDA_VISIBLE_DEVICES` before the driver starts; the emulated one filters its profile.

/// A UUID as `CUDA_VISIBLE_DEVICES` and `nvidia-smi -L` write it (`GPU-8-4-4-4-12` hex).
pub fn uuid_text(uuid: &[u8; 16]) -> String {
    let h: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!("GPU-{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

/// The GPUs of this machine as the NVIDIA driver lists them (None: no driver's list).
pub fn physical_gpus() -> Option<u32> {
    let n = std::fs::read_dir("/proc/driver/nvidia/gpus").ok()?.count();
    (n > 0).then_some(n as u32)
}

/// One entry of a device list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Index(usize),
    /// A UUID or a prefix of one, with its `GPU-` prefix.
    Uuid(String),
}

/// The entries of a `CUDA_VISIBLE_DEVICES` value up to the first one CUDA would not accept
/// as written (neither an index nor a `GPU-`/`MIG-` name).
pub fn parse(list: &str) -> Vec<Entry> {
    let mut out = Vec::new();
    for raw in list.split(',') {
        let e = raw.trim();
        if let Ok(i) = e.parse::<usize>() {
            out.push(Entry::Index(i));
        } else if e.len() > 4 && (e.starts_with("GPU-") || e.starts_with("MIG-")) {
            out.push(Entry::Uuid(e.to_owned()));
        } else {
            break;
        }
    }
    out
}

/// The positions (into `uuids`, the GPUs the server exposes, in order) of the GPUs `list`
/// selects, by CUDA's rules.
pub fn select(list: &str, uuids: &[String]) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::new();
    for entry in parse(list) {
        let found = match &entry {
            Entry::Index(i) => (*i < uuids.len()).then_some(*i),
            Entry::Uuid(prefix) => {
                let mut matching = uuids.iter().enumerate().filter(|(_, u)| u.starts_with(prefix.as_str()));
                match (matching.next(), matching.next()) {
                    (Some((i, _)), None) => Some(i),
                    _ => None,
                }
            }
        };
        match found {
            Some(i) if !out.contains(&i) => out.push(i),
            _ => break,
        }
    }
    out
}

/// For the real backend, before the driver starts: the `CUDA_VISIBLE_DEVICES` its process
/// should have so that it shows what `client` (the program's list) selects among `server`
/// (the server's own list; None: every GPU). An index of the program's picks the server's
/// entry at that position; a UUID stands for itself where the server names no list, else
/// only as one of the server's UUID entries (a server listing indices cannot tell which
/// UUID each is before its driver starts: such an entry ends the list).
pub fn compose(client: &str, server: Option<&str>) -> String {
    let Some(server) = server else { return client.to_owned() };
    let exposed = parse(server);
    let mut out: Vec<String> = Vec::new();
    for entry in parse(client) {
        let picked = match &entry {
            Entry::Index(i) => exposed.get(*i).cloned(),
            Entry::Uuid(prefix) => {
                let mut matching =
                    exposed.iter().filter(|e| matches!(e, Entry::Uuid(u) if u.starts_with(prefix.as_str())));
                match (matching.next(), matching.next()) {
                    (Some(e), None) => Some(e.clone()),
                    _ => None,
                }
            }
        };
        let Some(picked) = picked else { break };
        let text = match picked {
            Entry::Index(i) => i.to_string(),
            Entry::Uuid(u) => u,
        };
        if out.contains(&text) {
            break;
        }
        out.push(text);
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uuids() -> Vec<String> {
        ["GPU-aaaa-1", "GPU-bbbb-2", "GPU-abcd-3"].iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn uuids_are_written_as_cuda_names_them() {
        let u: [u8; 16] = core::array::from_fn(|i| i as u8 * 17);
        assert_eq!(uuid_text(&u), "GPU-00112233-4455-6677-8899-aabbccddeeff");
    }

    #[test]
    fn entries_parse_up_to_the_first_cuda_would_not_take() {
        assert_eq!(parse("1, 0"), [Entry::Index(1), Entry::Index(0)]);
        assert_eq!(parse("GPU-ab,2,x,1"), [Entry::Uuid("GPU-ab".into()), Entry::Index(2)]);
        assert!(parse("").is_empty());
        assert!(parse("-1,0").is_empty());
    }

    #[test]
    fn selection_follows_cudas_rules() {
        let u = uuids();
        assert_eq!(select("1", &u), [1]);
        assert_eq!(select("2,0", &u), [2, 0]);
        assert_eq!(select("GPU-bbbb", &u), [1]);
        // Ambiguous prefix, out of range, repeated: the list ends there.
        assert_eq!(select("0,GPU-a", &u), [0]);
        assert_eq!(select("1,7,0", &u), [1]);
        assert_eq!(select("1,1,0", &u), [1]);
        assert!(select("", &u).is_empty());
    }

    #[test]
    fn the_programs_list_composes_with_the_servers() {
        assert_eq!(compose("1,0", None), "1,0");
        assert_eq!(compose("1", Some("2,3")), "3");
        assert_eq!(compose("1,0", Some("2,3")), "3,2");
        assert_eq!(compose("0,5", Some("2,3")), "2");
        assert_eq!(compose("GPU-bb", Some("GPU-aa-1,GPU-bb-2")), "GPU-bb-2");
        assert_eq!(compose("GPU-bb", Some("0,1")), "");
        assert_eq!(compose("", Some("0,1")), "");
    }
}
