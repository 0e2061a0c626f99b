#!/usr/bin/env python3
"""Counts non-test code: files over 600 lines and functions over 150 lines, each file counted
up to its test module (`#[cfg(test)]`), `tests/` directories and `tests.rs` files left out.
Usage: scripts/code-size.py [crates-dir]   (default: crates/ beside this script)
"""
import os,re,sys
root=sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'crates')
files=[];funcs=[]
for d,_,fs in os.walk(root):
    if '/target' in d or '/tests' in d.replace(root,'') : continue
    for f in fs:
        if not f.endswith('.rs'): continue
        p=os.path.join(d,f)
        if os.path.basename(p)=='tests.rs' or '/tests/' in p: continue
        lines=open(p).read().split('\n')
        n=len(lines)
        for i,l in enumerate(lines):
            if re.match(r'^#\[cfg\(test\)\]',l) and i+1<len(lines) and re.match(r'^\s*mod tests\b',lines[i+1]):
                n=i;break
        files.append((n,p))
        # functions: find 'fn ' lines and matching brace by indentation
        i=0
        while i<n:
            l=lines[i]
            m=re.match(r'^(\s*)(pub(\([^)]*\))?\s+)?(async\s+)?(const\s+)?fn\s+(\w+)',l)
            if m:
                ind=m.group(1)
                # find end: line == ind+'}' 
                j=i+1
                # skip signature lines until line ending with '{' or ';'
                k=i
                while k<n and not lines[k].rstrip().endswith('{') and not lines[k].rstrip().endswith(';'):
                    k+=1
                if k<n and lines[k].rstrip().endswith(';'):
                    i=k+1;continue
                j=k+1
                while j<n and lines[j].rstrip()!=ind+'}':
                    j+=1
                funcs.append((j-i+1,p,m.group(6)))
            i+=1
big=[x for x in files if x[0]>600]; big.sort(reverse=True)
bf=[x for x in funcs if x[0]>150]; bf.sort(reverse=True)
print(f"files over 600: {len(big)}")
for x in big: print("  ",x[0],x[1].replace(root+'/',''))
print(f"functions over 150: {len(bf)}")
for x in bf: print("  ",x[0],x[1].replace(root+'/',''),x[2])
