//! Device profiles: the canonical record of a GPU's properties and attributes that the
//! handshake sends and the client answers device queries from.

use std::path::Path;

use anyhow::{Context, Result, bail};
use chidori_cuda::structs::{self, StructMap};
use chidori_protocol::messages::{Device, PropValue};

/// A profile as `gpu/record_profile.py` writes it.
#[derive(serde::Deserialize)]
struct Recorded {
    driver_version: i32,
    runtime_version: i32,
    devices: Vec<RecordedDevice>,
}

#[derive(serde::Deserialize)]
struct RecordedDevice {
    ordinal: u32,
    name: String,
    uuid: String,
    total_mem: u64,
    attributes: std::collections::BTreeMap<String, RecordedAttribute>,
    #[serde(rename = "cudaDeviceProp_13_0")]
    props: serde_json::Map<String, serde_json::Value>,
}

#[derive(serde::Deserialize)]
struct RecordedAttribute {
    value: i32,
    result: Option<i32>,
}

/// A loaded profile: the driver and runtime versions it was recorded with, and its devices.
pub struct Profile {
    pub driver_version: i32,
    pub runtime_version: i32,
    pub devices: Vec<Device>,
}

pub const PROPS_VERSION: &str = "13.0";

pub fn load(path: &Path) -> Result<Profile> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading device profile {}", path.display()))?;
    let recorded: Recorded =
        serde_json::from_str(&text).with_context(|| format!("parsing device profile {}", path.display()))?;
    let map = structs::get(PROPS_VERSION, "cudaDeviceProp").context("no cudaDeviceProp map for 13.0")?;
    let mut devices = Vec::new();
    for d in recorded.devices {
        let mut uuid = [0u8; 16];
        let bytes = hex(&d.uuid).context("uuid is not hex")?;
        if bytes.len() != 16 {
            bail!("uuid of device {} is not 16 bytes", d.ordinal);
        }
        uuid.copy_from_slice(&bytes);
        let mut attributes: Vec<(i32, i32)> =
            d.attributes.values().filter_map(|a| a.result.map(|r| (a.value, r))).collect();
        attributes.sort();
        let mut props = Vec::new();
        for field in map.fields {
            if field.name == "uuid" {
                // The device's UUID as cuDeviceGetUuid reported it.
                props.push((field.name.to_owned(), PropValue::Bytes(uuid.to_vec())));
                continue;
            }
            let Some(value) = d.props.get(field.name) else { continue };
            let value = match value {
                serde_json::Value::Number(n) => PropValue::Int(n.as_i64().unwrap_or(0)),
                serde_json::Value::Array(items) => {
                    PropValue::Ints(items.iter().map(|i| i.as_i64().unwrap_or(0)).collect())
                }
                serde_json::Value::String(s) if field.ty.starts_with("[i8;") => PropValue::Text(s.clone()),
                serde_json::Value::String(s) => PropValue::Bytes(hex(s).unwrap_or_default()),
                _ => continue,
            };
            props.push((field.name.to_owned(), value));
        }
        devices.push(Device {
            ordinal: d.ordinal,
            name: d.name,
            uuid,
            total_mem: d.total_mem,
            attributes,
            props,
            props_version: PROPS_VERSION.to_owned(),
        });
    }
    Ok(Profile { driver_version: recorded.driver_version, runtime_version: recorded.runtime_version, devices })
}

impl Profile {
    /// The devices a program's `CUDA_VISIBLE_DEVICES` selects, in its order, numbered from 0.
    pub fn select(mut self, list: &str) -> Profile {
        let uuids: Vec<String> = self.devices.iter().map(|d| crate::visible::uuid_text(&d.uuid)).collect();
        let picked = crate::visible::select(list, &uuids);
        let mut all: Vec<Option<Device>> = self.devices.drain(..).map(Some).collect();
        self.devices = picked.into_iter().filter_map(|i| all.get_mut(i).and_then(Option::take)).collect();
        for (n, d) in self.devices.iter_mut().enumerate() {
            d.ordinal = n as u32;
        }
        self
    }
}

fn hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok()).collect()
}

/// Decode a raw struct (`cudaDeviceProp` as the server's runtime wrote it) field by field.
pub fn decode_props(map: &StructMap, raw: &[u8]) -> Vec<(String, PropValue)> {
    let mut out = Vec::new();
    for f in map.fields {
        let start = f.offset as usize;
        let Some(bytes) = raw.get(start..start + f.size as usize) else { continue };
        let value = if f.ty.starts_with("[i8;") {
            let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
            PropValue::Text(String::from_utf8_lossy(&bytes[..end]).into_owned())
        } else if let Some(inner) = f.ty.strip_prefix('[').and_then(|t| t.split(';').next()) {
            let width = prim_width(inner.trim());
            match width {
                Some(w) => PropValue::Ints(bytes.chunks(w).map(|c| int_le(c, inner.trim().starts_with('i'))).collect()),
                None => PropValue::Bytes(bytes.to_vec()),
            }
        } else if prim_width(f.ty).is_some() {
            PropValue::Int(int_le(bytes, f.ty.starts_with('i')))
        } else {
            PropValue::Bytes(bytes.to_vec())
        };
        out.push((f.name.to_owned(), value));
    }
    out
}

pub fn prim_width(ty: &str) -> Option<usize> {
    Some(match ty {
        "i8" | "u8" => 1,
        "i16" | "u16" => 2,
        "i32" | "u32" => 4,
        "i64" | "u64" | "usize" | "isize" => 8,
        _ => return None,
    })
}

fn int_le(bytes: &[u8], signed: bool) -> i64 {
    let mut b = [0u8; 8];
    b[..bytes.len().min(8)].copy_from_slice(&bytes[..bytes.len().min(8)]);
    let v = u64::from_le_bytes(b);
    if signed && !bytes.is_empty() && bytes.len() < 8 {
        let shift = 64 - 8 * bytes.len() as u32;
        ((v << shift) as i64) >> shift
    } else {
        v as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_h200_profile_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/nvidia-h200.json");
        let p = load(&path).unwrap();
        assert_eq!(p.devices.len(), 1);
        let d = &p.devices[0];
        assert_eq!(d.name, "NVIDIA H200");
        // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16; COMPUTE_CAPABILITY_MAJOR = 75.
        assert_eq!(d.attributes.iter().find(|(a, _)| *a == 16).map(|a| a.1), Some(132));
        assert_eq!(d.attributes.iter().find(|(a, _)| *a == 75).map(|a| a.1), Some(9));
        let prop = |n: &str| d.props.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        assert_eq!(prop("name"), Some(PropValue::Text("NVIDIA H200".into())));
        assert_eq!(prop("maxThreadsDim"), Some(PropValue::Ints(vec![1024, 1024, 64])));
        assert!(matches!(prop("uuid"), Some(PropValue::Bytes(b)) if b.len() == 16));
    }

    #[test]
    fn raw_props_decode_by_the_map() {
        let map = structs::get("13.0", "cudaDeviceProp").unwrap();
        let mut raw = vec![0u8; map.size as usize];
        raw[..4].copy_from_slice(b"GPU\0");
        let field = |n: &str| map.fields.iter().find(|f| f.name == n).unwrap();
        let mtd = field("maxThreadsDim");
        raw[mtd.offset as usize..mtd.offset as usize + 4].copy_from_slice(&1024i32.to_le_bytes());
        let numa = field("deviceNumaId");
        raw[numa.offset as usize..numa.offset as usize + 4].copy_from_slice(&(-1i32).to_le_bytes());
        let props = decode_props(map, &raw);
        let get = |n: &str| props.iter().find(|(k, _)| k == n).unwrap().1.clone();
        assert_eq!(get("name"), PropValue::Text("GPU".into()));
        assert_eq!(get("maxThreadsDim"), PropValue::Ints(vec![1024, 0, 0]));
        assert_eq!(get("deviceNumaId"), PropValue::Int(-1));
    }
}
