//! Small ELF queries on shared libraries: SONAME, version definitions, versioned exports.
//! Used to record what the real NVIDIA libraries look like and to check the shims we build.

use anyhow::{Context, Result};
use object::Endianness;
use object::elf;
use object::read::elf::{Dyn, ElfFile64, FileHeader};
use object::{Object, ObjectSymbol};

pub type Elf<'a> = ElfFile64<'a, Endianness>;

pub fn soname(file: &Elf<'_>) -> Result<Option<String>> {
    let endian = file.endian();
    let data = file.data();
    let sections = file.elf_section_table();
    let Some((dynamic, link)) = sections.dynamic(endian, data)? else { return Ok(None) };
    let strings = sections.strings(endian, data, link)?;
    for entry in dynamic {
        if entry.tag(endian) == elf::DT_SONAME {
            let name = entry.string(endian, strings)?;
            return Ok(Some(String::from_utf8_lossy(name).into_owned()));
        }
    }
    Ok(None)
}

/// The non-base version definitions, and for each dynamic symbol index (as in
/// `ObjectSymbol::index`) the version node name its definition carries (None for unversioned).
pub fn version_definitions(file: &Elf<'_>) -> Result<(Vec<String>, Vec<Option<String>>)> {
    let endian = file.endian();
    let data = file.data();
    let sections = file.elf_section_table();
    let mut nodes = Vec::new();
    if let Some((mut verdefs, link)) = sections.gnu_verdef(endian, data)? {
        let strings = sections.strings(endian, data, link)?;
        while let Some((verdef, mut auxs)) = verdefs.next()? {
            let is_base = verdef.vd_flags.get(endian).contains(elf::VER_FLG_BASE);
            if let Some(aux) = auxs.next()? {
                let name = String::from_utf8_lossy(aux.name(endian, strings)?).into_owned();
                if !is_base {
                    nodes.push(name);
                }
            }
        }
    }
    let mut by_symbol = Vec::new();
    if let Some(table) = sections.versions(endian, data).context("reading .gnu.version")? {
        // Index 0 is the null symbol, which dynamic_symbols() skips.
        let count = file.dynamic_symbols().count() + 1;
        for index in 0..count {
            let versym = table.version_index(endian, object::SymbolIndex(index));
            let version_index = versym.index();
            let name = if version_index.is_special() {
                None
            } else {
                table.version(version_index)?.map(|v| String::from_utf8_lossy(v.name()).into_owned())
            };
            by_symbol.push(name);
        }
    }
    Ok((nodes, by_symbol))
}

/// Exported functions as `name@node` (or bare `name` where unversioned), with whether the
/// definition is the default (`@@`) one.
pub fn versioned_exports(bytes: &[u8]) -> Result<Vec<(String, Option<String>, bool)>> {
    let file = Elf::parse(bytes)?;
    let endian = file.endian();
    let data = file.data();
    let sections = file.elf_section_table();
    let table = sections.versions(endian, data)?;
    let mut out = Vec::new();
    for symbol in file.dynamic_symbols() {
        if symbol.is_undefined() || !symbol.is_global() {
            continue;
        }
        let name = symbol.name()?.to_owned();
        let (node, default) = match &table {
            Some(table) => {
                let versym = table.version_index(endian, symbol.index());
                if versym.index().is_special() {
                    (None, true)
                } else {
                    let node = table.version(versym.index())?.map(|v| String::from_utf8_lossy(v.name()).into_owned());
                    (node, !versym.is_hidden())
                }
            }
            None => (None, true),
        };
        out.push((name, node, default));
    }
    Ok(out)
}

/// Keep the generic header trait in scope for `file.elf_header()` users.
pub fn is_shared_object(file: &Elf<'_>) -> bool {
    file.elf_header().e_type(file.endian()) == elf::ET_DYN
}
