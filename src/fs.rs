//! File-system calls for fibers: each runs through [`blocking`], on a helper
//! thread while the fiber parks, so a slow disk holds no carrier (and none of the fibers homed
//! on it).
//! The types and signatures are `std::fs`'s; from a plain thread they are plain `std::fs` calls.

use std::fs as sfs;
use std::io::{self, IoSlice, IoSliceMut, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

pub use std::fs::{DirEntry, FileType, Metadata, OpenOptions, Permissions, ReadDir};

use crate::blocking::blocking;

/// An open file whose every operation is a blocking section. Dereferences to nothing: use the
/// `Read`/`Write`/`Seek` impls, or [`File::std`] for the rest of `std::fs::File`.
#[derive(Debug)]
pub struct File(sfs::File);

impl File {
    /// `std::fs::File::open`, as a blocking section.
    #[track_caller]
    pub fn open<P: AsRef<Path>>(path: P) -> io::Result<File> {
        let path = path.as_ref();
        blocking(|| sfs::File::open(path)).map(File)
    }

    /// `std::fs::File::create`, as a blocking section.
    #[track_caller]
    pub fn create<P: AsRef<Path>>(path: P) -> io::Result<File> {
        let path = path.as_ref();
        blocking(|| sfs::File::create(path)).map(File)
    }

    /// Opens with `options`, as a blocking section.
    #[track_caller]
    pub fn open_with<P: AsRef<Path>>(options: &OpenOptions, path: P) -> io::Result<File> {
        let path = path.as_ref();
        blocking(|| options.open(path)).map(File)
    }

    /// `sync_all`, as a blocking section.
    #[track_caller]
    pub fn sync_all(&self) -> io::Result<()> {
        blocking(|| self.0.sync_all())
    }

    /// `sync_data`, as a blocking section.
    #[track_caller]
    pub fn sync_data(&self) -> io::Result<()> {
        blocking(|| self.0.sync_data())
    }

    /// `set_len`, as a blocking section.
    #[track_caller]
    pub fn set_len(&self, size: u64) -> io::Result<()> {
        blocking(|| self.0.set_len(size))
    }

    /// `metadata`, as a blocking section.
    #[track_caller]
    pub fn metadata(&self) -> io::Result<Metadata> {
        blocking(|| self.0.metadata())
    }

    /// The underlying `std::fs::File`.
    pub fn std(&self) -> &sfs::File {
        &self.0
    }

    /// Unwraps into the `std::fs::File`.
    pub fn into_std(self) -> sfs::File {
        self.0
    }
}

impl From<sfs::File> for File {
    fn from(f: sfs::File) -> File {
        File(f)
    }
}

impl Read for File {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        blocking(|| self.0.read(buf))
    }
    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        blocking(|| self.0.read_vectored(bufs))
    }
    fn read_to_end(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        blocking(|| self.0.read_to_end(buf))
    }
    fn read_to_string(&mut self, buf: &mut String) -> io::Result<usize> {
        blocking(|| self.0.read_to_string(buf))
    }
}

impl Write for File {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        blocking(|| self.0.write(buf))
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        blocking(|| self.0.write_vectored(bufs))
    }
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        blocking(|| self.0.write_all(buf))
    }
    fn flush(&mut self) -> io::Result<()> {
        blocking(|| self.0.flush())
    }
}

impl Seek for File {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        blocking(|| self.0.seek(pos))
    }
}

macro_rules! blocking_fns {
    ($($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {$(
        $(#[$doc])*
        #[track_caller]
        pub fn $name<P: AsRef<Path>>(path: P $(, $arg: $ty)*) -> io::Result<$ret> {
            let path = path.as_ref();
            blocking(|| sfs::$name(path $(, $arg)*))
        }
    )*};
}

blocking_fns! {
    /// `std::fs::read`, as a blocking section.
    fn read() -> Vec<u8>;
    /// `std::fs::read_to_string`, as a blocking section.
    fn read_to_string() -> String;
    /// `std::fs::metadata`, as a blocking section.
    fn metadata() -> Metadata;
    /// `std::fs::symlink_metadata`, as a blocking section.
    fn symlink_metadata() -> Metadata;
    /// `std::fs::read_dir`, as a blocking section (iterating it blocks too: collect it inside
    /// `vt::blocking` for large directories).
    fn read_dir() -> ReadDir;
    /// `std::fs::canonicalize`, as a blocking section.
    fn canonicalize() -> PathBuf;
    /// `std::fs::create_dir`, as a blocking section.
    fn create_dir() -> ();
    /// `std::fs::create_dir_all`, as a blocking section.
    fn create_dir_all() -> ();
    /// `std::fs::remove_file`, as a blocking section.
    fn remove_file() -> ();
    /// `std::fs::remove_dir`, as a blocking section.
    fn remove_dir() -> ();
    /// `std::fs::remove_dir_all`, as a blocking section.
    fn remove_dir_all() -> ();
    /// `std::fs::set_permissions`, as a blocking section.
    fn set_permissions(perm: Permissions) -> ();
}

/// `std::fs::write`, as a blocking section.
#[track_caller]
pub fn write<P: AsRef<Path>, C: AsRef<[u8]>>(path: P, contents: C) -> io::Result<()> {
    let (path, contents) = (path.as_ref(), contents.as_ref());
    blocking(|| sfs::write(path, contents))
}

/// `std::fs::copy`, as a blocking section.
#[track_caller]
pub fn copy<P: AsRef<Path>, Q: AsRef<Path>>(from: P, to: Q) -> io::Result<u64> {
    let (from, to) = (from.as_ref(), to.as_ref());
    blocking(|| sfs::copy(from, to))
}

/// `std::fs::rename`, as a blocking section.
#[track_caller]
pub fn rename<P: AsRef<Path>, Q: AsRef<Path>>(from: P, to: Q) -> io::Result<()> {
    let (from, to) = (from.as_ref(), to.as_ref());
    blocking(|| sfs::rename(from, to))
}

/// `std::fs::hard_link`, as a blocking section.
#[track_caller]
pub fn hard_link<P: AsRef<Path>, Q: AsRef<Path>>(original: P, link: Q) -> io::Result<()> {
    let (original, link) = (original.as_ref(), link.as_ref());
    blocking(|| sfs::hard_link(original, link))
}
