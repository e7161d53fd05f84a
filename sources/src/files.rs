//! Opening the small input files (metadata, sample and variant lists, PLINK's text files)
//! only when they are regular files.
//!
//! A path that names a FIFO would block the open until a writer comes (a run hung there),
//! and one that names a device such as `/dev/zero` never ends (a read of it grew until the
//! kernel killed the process). Chunk files are checked the same way where they are opened.

use std::fs::File;
use std::io::{Error, ErrorKind, Read};
use std::path::Path;

/// Opens `path` for reading if it is a regular file (following links); anything else is an
/// [`ErrorKind::InvalidInput`] error that says so, refused without opening it.
pub fn open_regular(path: &Path) -> Result<File, Error> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            "not a regular file (refused without reading it)",
        ));
    }
    File::open(path)
}

/// The whole text of the regular file `path` ([`open_regular`]).
pub fn read_regular_to_string(path: &Path) -> Result<String, Error> {
    let mut text = String::new();
    open_regular(path)?.read_to_string(&mut text)?;
    Ok(text)
}

/// The bytes of the regular file `path`, refusing one of more than `most` bytes (metadata:
/// a document that size is not what its writer meant).
pub fn read_regular_at_most(path: &Path, most: u64) -> Result<Vec<u8>, Error> {
    let file = open_regular(path)?;
    let mut bytes = Vec::new();
    file.take(most + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > most {
        return Err(Error::new(
            ErrorKind::InvalidData,
            format!("longer than the {most} bytes a metadata document may have"),
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifos_devices_and_directories_are_refused_and_files_read() {
        let dir = std::env::temp_dir().join(format!("rankwise-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string; mkfifo only creates the node.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        for p in [fifo.as_path(), Path::new("/dev/zero"), dir.as_path()] {
            let e = open_regular(p).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{}", p.display());
            assert!(read_regular_to_string(p).is_err());
        }
        let file = dir.join("list");
        std::fs::write(&file, "a b\n").unwrap();
        assert_eq!(read_regular_to_string(&file).unwrap(), "a b\n");
        assert_eq!(read_regular_at_most(&file, 4).unwrap(), b"a b\n");
        let e = read_regular_at_most(&file, 3).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidData);
        assert_eq!(
            open_regular(&dir.join("absent")).unwrap_err().kind(),
            ErrorKind::NotFound
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
